package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"kurz.dev/pkg/ratelimitfields"
	"kurz.dev/pkg/rpcerr"
)

// Error codes of the error body beyond the gRPC code names.
const (
	codeMethodNotAllowed = "METHOD_NOT_ALLOWED"
	codeBodyTooLarge     = "PAYLOAD_TOO_LARGE"
	codeHeadersTooLarge  = "HEADERS_TOO_LARGE"
	codeURITooLong       = "URI_TOO_LONG"
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
	// details are google.rpc error details in their JSON form.
	details []json.RawMessage
	// header is set on the response (Allow, WWW-Authenticate).
	header http.Header
	// cause is logged, never sent.
	cause error
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

func newError(status int, code, msg string) *apiError {
	return &apiError{status: status, code: code, message: msg}
}

func badRequest(msg string) *apiError {
	return newError(http.StatusBadRequest, codeName(codes.InvalidArgument), msg)
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
	if e.status == http.StatusTooManyRequests || e.status == http.StatusServiceUnavailable {
		e.retryAfter = max(e.retryAfter, time.Second)
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

// errorBody is the uniform error answer.
type errorBody struct {
	Error errorFields `json:"error"`
}

type errorFields struct {
	Code         string            `json:"code"`
	Message      string            `json:"message"`
	RequestID    string            `json:"request_id"`
	RetryAfterMS int64             `json:"retry_after_ms,omitempty"`
	Details      []json.RawMessage `json:"details,omitempty"`
}

// writeError sends e as the uniform error body, with Retry-After when e has
// a retry delay.
func writeError(w http.ResponseWriter, requestID string, e *apiError) {
	h := w.Header()
	for k, vs := range e.header {
		h[k] = vs
	}
	body := errorBody{Error: errorFields{Code: e.code, Message: e.message, RequestID: requestID, Details: e.details}}
	if e.retryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(ceilSeconds(e.retryAfter), 10))
		body.Error.RetryAfterMS = int64(math.Ceil(float64(e.retryAfter) / float64(time.Millisecond)))
	}
	writeJSON(w, e.status, body)
}

// ceilSeconds rounds d up to whole seconds (never negative).
func ceilSeconds(d time.Duration) int64 { return ratelimitfields.CeilSeconds(d) }
