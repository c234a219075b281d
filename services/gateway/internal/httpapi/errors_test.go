package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/ratelimitfields"
	"kurz.dev/pkg/rpcerr"
)

func withDetails(t *testing.T, c codes.Code, msg string, details ...protoadapt.MessageV1) error {
	t.Helper()
	st, err := status.New(c, msg).WithDetails(details...)
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

// Every gRPC code maps to one HTTP status, and only user-facing messages
// get through: 5xx and transport errors are generic, 4xx keep the service's
// words and details, RetryInfo becomes the retry delay.
func TestToAPIError(t *testing.T) {
	kurzInfo := &errdetails.ErrorInfo{Reason: "RATE_LIMITED", Domain: "kurz.dev"}
	retry := &errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)}
	for name, tc := range map[string]struct {
		err        error
		status     int
		code, msg  string
		retryAfter time.Duration
		details    int
	}{
		"invalid argument": {withDetails(t, codes.InvalidArgument, "long_url is required",
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "long_url"}}}),
			400, "INVALID_ARGUMENT", "long_url is required", 0, 1},
		"not found":      {status.Error(codes.NotFound, "no such link"), 404, "NOT_FOUND", "no such link", 0, 0},
		"already exists": {status.Error(codes.AlreadyExists, "alias taken"), 409, "ALREADY_EXISTS", "alias taken", 0, 0},
		"kurz unauthenticated": {withDetails(t, codes.Unauthenticated, "no tenant", &errdetails.ErrorInfo{Reason: "TENANT_MISSING", Domain: "kurz.dev"}),
			401, "UNAUTHENTICATED", "no tenant", 0, 1},
		"service auth refused": {status.Error(codes.Unauthenticated, "the service assertion's signature does not verify (wrong key, or signed for another method)"),
			500, "INTERNAL", "internal error; try again later", 0, 0},
		"permission denied":   {status.Error(codes.PermissionDenied, "not yours"), 403, "PERMISSION_DENIED", "not yours", 0, 0},
		"failed precondition": {status.Error(codes.FailedPrecondition, "link disabled"), 400, "FAILED_PRECONDITION", "link disabled", 0, 0},
		"aborted":             {status.Error(codes.Aborted, "conflict"), 409, "ABORTED", "conflict", 0, 0},
		"out of range":        {status.Error(codes.OutOfRange, "too far"), 400, "OUT_OF_RANGE", "too far", 0, 0},
		"kurz rate limit": {withDetails(t, codes.ResourceExhausted, "too many links created; retry after 2s", kurzInfo, retry),
			429, "RESOURCE_EXHAUSTED", "too many links created; retry after 2s", 1500 * time.Millisecond, 1},
		"grpc's own resource exhausted": {status.Error(codes.ResourceExhausted, "grpc: received message larger than max (5000000 vs. 4194304)"),
			502, "INTERNAL", "a service behind the gateway sent an answer the gateway could not take; this is a fault on our side", 0, 0},
		"grpc's own resource exhausted, with a foreign ErrorInfo": {withDetails(t, codes.ResourceExhausted, "quota", &errdetails.ErrorInfo{Domain: "googleapis.com"}),
			502, "INTERNAL", "a service behind the gateway sent an answer the gateway could not take; this is a fault on our side", 0, 0},
		"kurz unavailable": {withDetails(t, codes.Unavailable, "link creation is paused", &errdetails.ErrorInfo{Domain: "kurz.dev"}, retry),
			503, "UNAVAILABLE", "link creation is paused", 1500 * time.Millisecond, 1},
		"transport unavailable": {status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp 10.0.0.7:9092: connect: connection refused\""),
			503, "UNAVAILABLE", "a service behind the gateway is unavailable; try again shortly", time.Second, 0},
		"a service's call gate full (pkg/server)": {status.Error(codes.Unavailable, "server busy: 1024 calls in flight, at most 1024 (KURZ_GRPC_MAX_CALLS)"),
			503, "UNAVAILABLE", "a service behind the gateway is unavailable; try again shortly", time.Second, 0},
		"deadline exceeded": {status.Error(codes.DeadlineExceeded, "context deadline exceeded"),
			503, "DEADLINE_EXCEEDED", "a service behind the gateway is unavailable; try again shortly", time.Second, 0},
		"internal":        {status.Error(codes.Internal, "pq: relation links does not exist"), 500, "INTERNAL", "internal error; try again later", 0, 0},
		"unknown":         {status.Error(codes.Unknown, "panic: nil map"), 500, "UNKNOWN", "internal error; try again later", 0, 0},
		"data loss":       {status.Error(codes.DataLoss, "disk"), 500, "DATA_LOSS", "internal error; try again later", 0, 0},
		"unimplemented":   {status.Error(codes.Unimplemented, "method GetLinkStats not implemented"), 501, "UNIMPLEMENTED", "this operation is not available yet", 0, 0},
		"cancelled":       {status.Error(codes.Canceled, "context canceled"), 499, "CANCELLED", "context canceled", 0, 0},
		"plain error":     {errors.New("dial tcp 10.0.0.7:5432: i/o timeout"), 500, "INTERNAL", "internal error; try again later", 0, 0},
		"local deadline":  {fmt.Errorf("call: %w", context.DeadlineExceeded), 503, "UNAVAILABLE", "the request took too long; try again", time.Second, 0},
		"apiError passes": {badRequest("page_size must be a whole number"), 400, "INVALID_ARGUMENT", "page_size must be a whole number", 0, 0},
	} {
		t.Run(name, func(t *testing.T) {
			e := toAPIError(tc.err)
			if e.status != tc.status || e.code != tc.code || e.message != tc.msg || e.retryAfter != tc.retryAfter || len(e.details) != tc.details {
				t.Errorf("got %d %s %q retry %v, %d details; want %d %s %q retry %v, %d details",
					e.status, e.code, e.message, e.retryAfter, len(e.details), tc.status, tc.code, tc.msg, tc.retryAfter, tc.details)
			}
		})
	}
}

// The error answer is an RFC 9457 problem detail: type (one URI per code),
// title, status, detail, instance (the path), and kurz's extensions: code,
// requestId, retryAfterMs (rounded up) with Retry-After in whole seconds
// (rounded up), the kurz reason, the fields at fault, details as given.
func TestWriteError(t *testing.T) {
	e := toAPIError(withDetails(t, codes.ResourceExhausted, "slow down",
		&errdetails.ErrorInfo{Reason: "RATE_LIMITED", Domain: "kurz.dev", Metadata: map[string]string{"rule": "per-ip"}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(1200*time.Millisecond + 300*time.Microsecond)},
		&errdetails.DebugInfo{Detail: "stack trace"}))
	w := httptest.NewRecorder()
	writeError(w, "req-1", e)
	want := `{"type":"https://kurz.dev/problems/resource-exhausted","title":"Too many requests","status":429,"detail":"slow down",` +
		`"instance":"urn:kurz:request:req-1","code":"RESOURCE_EXHAUSTED","requestId":"req-1","retryAfterMs":1201,"reason":"RATE_LIMITED",` +
		`"details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"RATE_LIMITED","domain":"kurz.dev","metadata":{"rule":"per-ip"}}]}` + "\n"
	if w.Code != http.StatusTooManyRequests || w.Body.String() != want || w.Header().Get("Retry-After") != "2" ||
		w.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("got %d %s %s (Retry-After %q)\nwant 429 application/problem+json %s (Retry-After 2)",
			w.Code, w.Header().Get("Content-Type"), w.Body, w.Header().Get("Retry-After"), want)
	}
	if strings.Contains(w.Body.String(), "stack trace") {
		t.Error("DebugInfo reached the client")
	}
}

// The gateway's own quota denial answers like a service's: Retry-After
// and retryAfterMs at least a second, and the reason RATE_LIMITED, however
// soon the limiter says a unit comes back.
func TestTheEdgeQuotaDenialAnswersLikeAServices(t *testing.T) {
	for _, retry := range []time.Duration{14 * time.Millisecond, 0, 2500 * time.Millisecond} {
		w := httptest.NewRecorder()
		writeError(w, "req-3", denied(DomainAPI, quota.Decision{Rule: "per-api-key", RetryAfter: retry}, "rate limit exceeded"))
		var got problem
		if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
			t.Fatal(err)
		}
		wantMS, wantHeader := int64(1000), "1"
		if retry > time.Second {
			wantMS, wantHeader = retry.Milliseconds(), "3"
		}
		if w.Code != http.StatusTooManyRequests || got.RetryAfterMS != wantMS || w.Header().Get("Retry-After") != wantHeader || got.Reason != rpcerr.ReasonRateLimited {
			t.Errorf("retry %v: %d, retryAfterMs %d, Retry-After %q, reason %q; want 429, %d, %s, RATE_LIMITED",
				retry, w.Code, got.RetryAfterMS, w.Header().Get("Retry-After"), got.Reason, wantMS, wantHeader)
		}
	}
}

// A field violation becomes an entry of errors: the field, its reason and
// what is wrong with it.
func TestWriteErrorNamesTheFieldsAtFault(t *testing.T) {
	e := toAPIError(withDetails(t, codes.InvalidArgument, "long_url: scheme ftp is not allowed",
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: "long_url", Reason: "URL_SCHEME", Description: "scheme ftp is not allowed"}}}))
	w := httptest.NewRecorder()
	writeError(w, "req-2", e)
	var got problem
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := []fieldError{{Field: "long_url", Reason: "URL_SCHEME", Detail: "scheme ftp is not allowed"}}
	if got.Type != "https://kurz.dev/problems/invalid-argument" || got.Title != "Invalid argument" || got.Status != 400 ||
		!reflect.DeepEqual(got.Errors, want) {
		t.Errorf("got %+v, want type .../invalid-argument, title Invalid argument, status 400, errors %+v", got, want)
	}
}

// A service's quota refusal (a 429 the gateway did not decide) drops the
// edge quota's RateLimit fields, which would say there is room; the
// gateway's own denial keeps them.
func TestServiceQuotaRefusalDropsTheEdgeFields(t *testing.T) {
	a := newBulkAPI(&bulkShortener{})
	for name, tc := range map[string]struct {
		err        error
		wantFields bool
	}{
		"the shortener's quota": {rpcerr.RetryLater(codes.ResourceExhausted, rpcerr.ReasonRateLimited, "too many links created (rule per-tenant)", 11*time.Second, nil), false},
		"the edge quota":        {denied(DomainAPI, quota.Decision{Rule: "per-api-key", RetryAfter: 11 * time.Second}, "rate limit exceeded"), true},
	} {
		w := httptest.NewRecorder()
		setRateLimitHeaders(w.Header(), DomainAPI, quota.Decision{Allowed: true, Rule: "per-api-key", Limit: 20, Remaining: 9, Window: time.Minute})
		a.fail(&call{w: w, r: httptest.NewRequest("POST", "/v1/links", nil), st: &reqState{id: "t"}}, tc.err)
		_, policy := w.Header()[ratelimitfields.PolicyField]
		_, state := w.Header()[ratelimitfields.StateField]
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "11" || policy != tc.wantFields || state != tc.wantFields {
			t.Errorf("%s: %d, Retry-After %q, RateLimit-Policy %v, RateLimit %v; want 429, 11, fields %v",
				name, w.Code, w.Header().Get("Retry-After"), policy, state, tc.wantFields)
		}
	}
}
