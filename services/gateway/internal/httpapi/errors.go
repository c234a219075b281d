package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/ratelimitfields"
	"kurz.dev/pkg/rpcerr"
)

// Error codes of the error body beyond the gRPC code names.
const (
	codeMethodNotAllowed = "METHOD_NOT_ALLOWED"
	codeBodyTooLarge     = "PAYLOAD_TOO_LARGE"
	codeHeadersTooLarge  = "HEADERS_TOO_LARGE"
	codeURITooLong       = "URI_TOO_LONG"
	// codePreconditionFailed: a precondition (If-Match, ...) that does not
	// hold, or cannot on this route.
	codePreconditionFailed = "PRECONDITION_FAILED"
)

// apiError is an HTTP error answer: status, a stable code, a message a
// person can act on, and what a client needs to retry.
type apiError struct {
	status  int
	code    string
	message string
	// retryAfter sets Retry-After (whole seconds, rounded up) and
	// retry_after_ms.
	retryAfter time.Duration
	// details are google.rpc error details in their JSON form; reason and
	// fields are read from them (ErrorInfo, BadRequest).
	details []json.RawMessage
	reason  string
	fields  []fieldError
	// header is set on the response (Allow, WWW-Authenticate).
	header http.Header
	// cause is logged, never sent.
	cause error
	// ownQuota marks the gateway's own limiter denials (denied): their
	// RateLimit fields are the answer's; another 429 (a service's quota)
	// must not carry the edge quota's fields, which say there is room.
	ownQuota bool
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

func newError(status int, code, msg string) *apiError {
	return &apiError{status: status, code: code, message: msg}
}

func badRequest(msg string) *apiError {
	return newError(http.StatusBadRequest, codeName(codes.InvalidArgument), msg)
}

// badParameter is badRequest naming the path or query parameter at fault
// in the problem's errors, as a service's BadRequest names a field.
func badParameter(name, msg string) *apiError {
	e := badRequest(msg)
	e.fields = []fieldError{{Field: name, Detail: msg}}
	return e
}

func notFound(msg string) *apiError {
	return newError(http.StatusNotFound, codeName(codes.NotFound), msg)
}

func internalError(cause error) *apiError {
	e := newError(http.StatusInternalServerError, codeName(codes.Internal), "internal error; try again later")
	e.cause = cause
	return e
}

func unavailable(msg string, cause error) *apiError {
	e := newError(http.StatusServiceUnavailable, codeName(codes.Unavailable), msg)
	e.retryAfter = time.Second
	e.cause = cause
	return e
}

// httpStatus is the one mapping of gRPC codes to HTTP statuses.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Canceled:
		return 499 // the client went away; only the log sees it
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable, codes.DeadlineExceeded:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError // Unknown, Internal, DataLoss
}

// codeNames are the canonical names of the gRPC codes (google.rpc.Code), as
// the error body's code.
var codeNames = map[codes.Code]string{
	codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN", codes.InvalidArgument: "INVALID_ARGUMENT",
	codes.DeadlineExceeded: "DEADLINE_EXCEEDED", codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED", codes.OutOfRange: "OUT_OF_RANGE",
	codes.Unimplemented: "UNIMPLEMENTED", codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE",
	codes.DataLoss: "DATA_LOSS", codes.Unauthenticated: "UNAUTHENTICATED",
}

func codeName(c codes.Code) string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return "UNKNOWN"
}

// toAPIError turns any error a handler returns into the answer to send: an
// *apiError as is, a gRPC status by the mapping above, anything else a 500.
// Messages of downstream statuses are passed on only where a kurz service
// wrote them for users: client errors (4xx), and 429/503 that carry a kurz
// ErrorInfo, and 401s that carry one. Transport errors (connection refused,
// deadlines, ...) get a generic message: they name internal addresses. Only
// a kurz quota is a 429: RESOURCE_EXHAUSTED from gRPC itself is a 502.
func toAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return unavailable("the request took too long; try again", err)
	case errors.Is(err, context.Canceled):
		e := newError(499, codeName(codes.Canceled), "the request was cancelled")
		e.cause = err
		return e
	}
	st, ok := status.FromError(err)
	if !ok {
		return internalError(err)
	}
	code := st.Code()
	e := &apiError{status: httpStatus(code), code: codeName(code), cause: err}
	fromKurz := false
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			e.retryAfter = d.GetRetryDelay().AsDuration()
		case *errdetails.ErrorInfo:
			// rpcerr.Domain marks a status a kurz service built on
			// purpose; its message is written for end users.
			fromKurz = fromKurz || d.GetDomain() == rpcerr.Domain
		}
	}
	switch {
	case e.status >= 500 && code != codes.Unavailable && code != codes.DeadlineExceeded:
		// Internal, Unknown, DataLoss, Unimplemented: nothing for the client
		// to act on, and the text may be internal.
		e.message = "internal error; try again later"
		if code == codes.Unimplemented {
			e.message = "this operation is not available yet"
		}
		e.retryAfter = 0
		return e
	case code == codes.Unauthenticated && !fromKurz:
		// The gateway authenticated the client itself; an UNAUTHENTICATED
		// no kurz service explained is the shortener or analytics refusing
		// the gateway's own assertion (KURZ_SERVICE_AUTH_KEY differs): an
		// operator's problem, logged, not the client's.
		return internalError(err)
	case e.status == http.StatusServiceUnavailable && !fromKurz:
		e.message = "a service behind the gateway is unavailable; try again shortly"
		e.retryAfter = max(e.retryAfter, time.Second)
		return e
	case code == codes.ResourceExhausted && !fromKurz:
		// Not a quota: a kurz service says those with its ErrorInfo. This
		// is gRPC's own (a message over a size limit, a stream limit), a
		// fault between the gateway and the service that the client cannot
		// wait out; a 429 would have it retry forever.
		e.status, e.code = http.StatusBadGateway, codeName(codes.Internal)
		e.message = "a service behind the gateway sent an answer the gateway could not take; this is a fault on our side"
		e.retryAfter = 0
		return e
	}
	e.message = st.Message()
	e.details = publicDetails(st)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == rpcerr.Domain {
				e.reason = d.GetReason()
			}
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				e.fields = append(e.fields, fieldError{Field: v.GetField(), Reason: v.GetReason(), Detail: v.GetDescription()})
			}
		}
	}
	if e.status == http.StatusTooManyRequests || e.status == http.StatusServiceUnavailable {
		e.retryAfter = max(e.retryAfter, time.Second)
	}
	if code == codes.Aborted && e.reason == callmeta.ReasonETagMismatch {
		// The service's check of If-Match (or of the body's etag): the
		// link changed since the client read it.
		e.status, e.code = http.StatusPreconditionFailed, codePreconditionFailed
	}
	if code == codes.InvalidArgument && e.reason == callmeta.ReasonIdempotencyKeyReused {
		// The idempotency-key draft's answer to a key sent again with
		// another request: the request is well formed, the key's use not.
		e.status = http.StatusUnprocessableEntity
	}
	return e
}

// publicDetails returns the details a client may see, as JSON: why
// (ErrorInfo), which field (BadRequest), how to fix (Help, LocalizedMessage),
// which precondition or quota. RetryInfo becomes retry_after_ms instead;
// anything else (debug info) is dropped.
func publicDetails(st *status.Status) []json.RawMessage {
	var out []json.RawMessage
	for _, d := range st.Proto().GetDetails() {
		switch d.GetTypeUrl() {
		case typeURL(&errdetails.ErrorInfo{}), typeURL(&errdetails.BadRequest{}), typeURL(&errdetails.Help{}),
			typeURL(&errdetails.LocalizedMessage{}), typeURL(&errdetails.PreconditionFailure{}), typeURL(&errdetails.QuotaFailure{}):
			raw, err := protojson.Marshal(d)
			var buf bytes.Buffer
			if err == nil && json.Compact(&buf, raw) == nil {
				out = append(out, buf.Bytes())
			}
		}
	}
	return out
}

func typeURL(m proto.Message) string {
	return "type.googleapis.com/" + string(m.ProtoReflect().Descriptor().FullName())
}

// problemType is the base of the problem type URIs: one per code, e.g.
// https://kurz.dev/problems/invalid-argument, documented in docs/api.md.
const problemType = "https://kurz.dev/problems/"

// problemTitles are the problem titles by code: the same for every
// occurrence of a code, as RFC 9457 asks; the detail says what happened.
var problemTitles = map[string]string{
	"INVALID_ARGUMENT": "Invalid argument", "FAILED_PRECONDITION": "Failed precondition", "OUT_OF_RANGE": "Out of range",
	"UNAUTHENTICATED": "Unauthenticated", "PERMISSION_DENIED": "Permission denied", "NOT_FOUND": "Not found",
	"ALREADY_EXISTS": "Already exists", "ABORTED": "Conflict", "RESOURCE_EXHAUSTED": "Too many requests",
	"CANCELLED": "Request cancelled", "UNIMPLEMENTED": "Not implemented", "UNAVAILABLE": "Service unavailable",
	"DEADLINE_EXCEEDED": "Service unavailable", "INTERNAL": "Internal error", "UNKNOWN": "Internal error",
	"DATA_LOSS": "Internal error", codeMethodNotAllowed: "Method not allowed", codeBodyTooLarge: "Payload too large",
	codeHeadersTooLarge: "Headers too large", codeURITooLong: "URI too long", codePreconditionFailed: "Precondition failed",
}

// problem is the error answer: an RFC 9457 problem detail
// (application/problem+json) with kurz's extensions.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Instance names this occurrence: urn:kurz:request:<request ID>. Not
	// the path, which would echo what the client sent (other tenants'
	// names in a refused request, markup) back into the answer.
	Instance string `json:"instance,omitempty"`
	// Code is the stable machine-readable code (gRPC code names, plus the
	// gateway's own for HTTP-level refusals).
	Code      string `json:"code"`
	RequestID string `json:"requestId"`
	// RetryAfterMS is the wait in milliseconds, rounded up (Retry-After
	// says it in whole seconds, rounded up).
	RetryAfterMS int64 `json:"retryAfterMs,omitempty"`
	// Reason is the ErrorInfo reason of a kurz refusal (e.g. ALIAS_TAKEN).
	Reason string `json:"reason,omitempty"`
	// Errors are the fields at fault (BadRequest field violations).
	Errors []fieldError `json:"errors,omitempty"`
	// Details are the public google.rpc error details, in their JSON form,
	// for clients that read gRPC's.
	Details []json.RawMessage `json:"details,omitempty"`
}

// fieldError is one field at fault.
type fieldError struct {
	Field  string `json:"field"`
	Reason string `json:"reason,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// problemTypeOf is the type URI of a code: problemType then the code in
// lower case with dashes.
func problemTypeOf(code string) string {
	return problemType + strings.ReplaceAll(strings.ToLower(code), "_", "-")
}

// writeError sends e as a problem detail, with Retry-After when e has a
// retry delay.
func writeError(w http.ResponseWriter, requestID string, e *apiError) {
	writeProblem(w, e, problemOf(requestID, e))
}

// problemOf is the problem detail of e.
func problemOf(requestID string, e *apiError) problem {
	title, ok := problemTitles[e.code]
	if !ok {
		title = http.StatusText(e.status)
	}
	body := problem{Type: problemTypeOf(e.code), Title: title, Status: e.status, Detail: e.message,
		Code: e.code, RequestID: requestID, Reason: e.reason, Errors: e.fields, Details: e.details}
	if requestID != "" {
		body.Instance = "urn:kurz:request:" + requestID
	}
	if e.retryAfter > 0 {
		body.RetryAfterMS = int64(math.Ceil(float64(e.retryAfter) / float64(time.Millisecond)))
	}
	return body
}

// writeProblem sends body, the problem detail of e (or one built on it),
// with e's status and headers.
func writeProblem(w http.ResponseWriter, e *apiError, body any) {
	// An error is never to be reused, whatever caching the handler had set
	// for the answer it meant to give (the QR image's).
	w.Header().Set("Cache-Control", "no-store")
	errorHeaders(w.Header(), e)
	status := e.status
	b, err := json.Marshal(body)
	if err != nil {
		b = []byte(`{"type":"` + problemTypeOf("INTERNAL") + `","title":"Internal error","status":500,"code":"INTERNAL"}`)
		status = http.StatusInternalServerError
	}
	send(w, status, "application/problem+json", append(b, '\n'))
}

// errorHeaders sets the header fields of e on h: its own (Allow,
// WWW-Authenticate) and Retry-After when it has a retry delay.
func errorHeaders(h http.Header, e *apiError) {
	for k, vs := range e.header {
		h[k] = vs
	}
	if e.retryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(ceilSeconds(e.retryAfter), 10))
	}
}

// ceilSeconds rounds d up to whole seconds (never negative).
func ceilSeconds(d time.Duration) int64 { return ratelimitfields.CeilSeconds(d) }
