package quotaapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"kurz.dev/pkg/textcut"
)

// EnvoyJSON serves envoyproxy/ratelimit's HTTP endpoint POST /json: a
// RateLimitRequest as JSON (protojson, Envoy's field names), decided by
// svc.ShouldRateLimit, the gRPC API's handler, and its RateLimitResponse
// as JSON. The status is envoyproxy/ratelimit's: 200 for OK, 429 for
// OVER_LIMIT, 500 for UNKNOWN; a request the API refuses is 400 with its
// message. Like envoyproxy/ratelimit it leaves response_headers_to_add in
// the body, not in the response's own header: they are for the client of
// the caller, not for the caller.
//
// It is stricter than envoyproxy/ratelimit, which takes any method, any
// content type and a body of any size: a method other than POST is 405; a
// Content-Type other than application/json is 415, so that a browser on
// another origin cannot spend a limit with a form or a text/plain fetch
// (those need no CORS preflight); a body over maxBody is 413, as gRPC
// refuses a message over the limiter's receive bound; an unknown field is
// 400 (protojson's default), not ignored. Each decision is bounded by
// timeout, as Envoy's deadline bounds a gRPC call. Requests are read and
// decided within inFlight's bound (see InFlight); past it a request is 503
// at once, its body unread.
type EnvoyJSON struct {
	svc      rlsv3.RateLimitServiceServer
	maxBody  int64
	inFlight *InFlight
	timeout  time.Duration
	log      *slog.Logger
}

// NewEnvoyJSON returns POST /json over svc; see EnvoyJSON.
func NewEnvoyJSON(svc rlsv3.RateLimitServiceServer, maxBody int64, inFlight *InFlight, timeout time.Duration, log *slog.Logger) *EnvoyJSON {
	return &EnvoyJSON{svc: svc, maxBody: maxBody, inFlight: inFlight, timeout: timeout, log: log}
}

// InFlight bounds the requests the limiter's HTTP decision endpoints (POST
// /json and /forward-auth/{domain}, together) serve at once, as the gRPC
// server bounds its calls (server.GRPCMaxCallsFor): each holds its request
// (a /json body, a forward-auth request's headers) and what it decodes
// to, and the listener's connection cap alone (thousands, each trickling
// a request) would let strangers hold more than the process has.
type InFlight struct {
	slots chan struct{} // a token per request being served
}

// NewInFlight returns the bound of n requests at once, at least 1.
func NewInFlight(n int) *InFlight {
	return &InFlight{slots: make(chan struct{}, max(n, 1))}
}

// enter takes a slot for a request, to give back with leave; with none
// free it answers 503 with a Retry-After and reports false.
func (f *InFlight) enter(w http.ResponseWriter) bool {
	select {
	case f.slots <- struct{}{}:
		return true
	default:
		w.Header().Set("Retry-After", "1")
		http.Error(w, fmt.Sprintf("busy: %d requests in flight, the limiter's bound; try again", cap(f.slots)), http.StatusServiceUnavailable)
		return false
	}
}

// leave gives back the slot enter took.
func (f *InFlight) leave() { <-f.slots }

// ServeHTTP implements http.Handler.
func (h *EnvoyJSON) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, done, ok := readJSONPost(w, r, "RateLimitRequest", h.maxBody, h.inFlight, func(w http.ResponseWriter, code int, msg string) {
		http.Error(w, msg, code)
	})
	if !ok {
		return
	}
	defer done()
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, "invalid RateLimitRequest JSON: "+textcut.Echo(err.Error(), maxEcho), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	resp, err := h.svc.ShouldRateLimit(ctx, &req)
	if err != nil {
		if st, _ := status.FromError(err); st.Code() == codes.InvalidArgument {
			http.Error(w, st.Message(), http.StatusBadRequest)
			return
		}
		h.log.ErrorContext(ctx, "envoy /json: ShouldRateLimit failed", "err", err)
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		h.log.ErrorContext(ctx, "envoy /json: response not marshalled", "err", err)
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return
	}
	code := http.StatusOK
	switch resp.GetOverallCode() {
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		code = http.StatusTooManyRequests
	case rlsv3.RateLimitResponse_UNKNOWN:
		code = http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(out)
}

// readJSONPost reads the JSON body of a POST to one of the HTTP decision
// endpoints (what names the message it holds) within their bounds: only
// POST (405), only Content-Type application/json (415), at most maxBody
// bytes (413), within inFlight (503), arriving within bodyWait of taking
// its slot (408). A refusal is answered through refuse
// (the endpoint's own error format) and ok is false; otherwise the caller
// holds an in-flight slot until it calls done.
func readJSONPost(w http.ResponseWriter, r *http.Request, what string, maxBody int64, inFlight *InFlight, refuse func(w http.ResponseWriter, code int, msg string)) (body []byte, done func(), ok bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		refuse(w, http.StatusMethodNotAllowed, "POST a "+what+" as JSON")
		return nil, nil, false
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		refuse(w, http.StatusUnsupportedMediaType, "Content-Type must be application/json")
		return nil, nil, false
	}
	if r.ContentLength > maxBody {
		refuse(w, http.StatusRequestEntityTooLarge, tooLarge(maxBody))
		return nil, nil, false
	}
	if !inFlight.enter(w) {
		return nil, nil, false
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyWait)) // a recorder has no deadlines: unbounded in tests
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	_ = rc.SetReadDeadline(time.Time{})
	if err != nil {
		inFlight.leave()
		// What is left of the body must not be read as the next request,
		// nor read at all: net/http would wait for it to reuse the
		// connection, with no deadline now.
		w.Header().Set("Connection", "close")
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			refuse(w, http.StatusRequestEntityTooLarge, tooLarge(maxBody))
			return nil, nil, false
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			refuse(w, http.StatusRequestTimeout, fmt.Sprintf("the request body did not arrive within %s of its headers; nothing was decided: send it with its headers", bodyWait))
			return nil, nil, false
		}
		// The client went away or stalled past the listener's read
		// timeout: nobody reads the answer.
		refuse(w, http.StatusBadRequest, "reading the request body failed")
		return nil, nil, false
	}
	return body, inFlight.leave, true
}

// bodyWait is how long a decision's body may take to arrive once its
// request holds an in-flight slot. The body is a few hundred bytes sent with
// its headers; under the listener's read timeout (30 s) a few connections
// stalling their bodies held every slot, and forward-auth, which shares
// them, answered every proxied request 503. A variable for the tests.
var bodyWait = time.Second

// maxEcho bounds the part of a decoding error sent back: protojson quotes
// the offending token (an unknown field's name, a value), which is the
// caller's own input, up to the whole body.
const maxEcho = 256

func tooLarge(maxBody int64) string {
	return fmt.Sprintf("request body over %d bytes, the limiter's request bound", maxBody)
}

// EnvoyHealthcheck serves envoyproxy/ratelimit's GET /healthcheck as it
// answers it: 200 "OK" while ready() (the limiter's readiness, as /readyz
// tells it), else 500 with no body.
func EnvoyHealthcheck(ready func() bool) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("OK"))
	}
}
