package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/telemetry"
)

// maxURIBytes bounds the request target; longer ones are answered 414.
const maxURIBytes = 8 << 10

// unmatchedRoute labels requests no route took, in metrics and logs, so
// scanners cannot blow up the metrics' cardinality.
const unmatchedRoute = "unmatched"

// opsRoutes are logged at debug level: probes would drown the request log.
// (/readyz and /metrics are on the ops listener, not behind Wrap.)
var opsRoutes = []string{"GET /healthz"}

// reqState is what the middleware knows of a request, filled in as the
// request goes through: its ID, client IP, route and tenant. ipKey is the
// client's limiter key (pkg/clientip: an IPv6 client's prefix), ip its
// address, for logs and for the services behind the gateway.
type reqState struct {
	id     string
	ip     string
	ipKey  string
	route  string
	tenant string
}

func (s *reqState) setTenant(t string) { s.tenant = t }

type stateKey struct{}

// stateOf returns the request's state; requests that did not come through
// Wrap (none in production) get a fresh one.
func stateOf(r *http.Request) *reqState {
	if st, ok := r.Context().Value(stateKey{}).(*reqState); ok {
		return st
	}
	return &reqState{id: newRequestID()}
}

// Wrap is the gateway's HTTP handler around mux (which must hold the API's
// routes and /healthz): a request ID on every response, limits on the
// request line and header size, canonical paths only, JSON answers for
// unknown routes (404) and methods (405, with Allow), CORS under /rest/ (the
// Shlink API's, for its browser client), then one log line and the metrics
// of every request.
func (a *API) Wrap(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		outer := r // the server's telemetry reads its route from this one
		st := &reqState{id: requestID(r), route: unmatchedRoute}
		if ip := a.opts.Clients.Client(r); ip.IsValid() {
			st.ip, st.ipKey = ip.String(), a.opts.Keying.Key(ip)
		}
		w.Header()["X-Request-ID"] = []string{st.id} // as spelt by most proxies, not Go's X-Request-Id
		rec := &telemetry.StatusWriter{ResponseWriter: w}
		r = r.WithContext(context.WithValue(r.Context(), stateKey{}, st))
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				// A last resort: one bad request must not take the
				// connection's other work down, nor go unanswered.
				a.log.ErrorContext(r.Context(), "handler panicked", "route", st.route, "request_id", st.id, "panic", p)
				if rec.Status == 0 {
					writeError(rec, st.id, internalError(nil))
				}
			}
			a.observe(r, rec.Status, st, time.Since(start))
		}()
		shlinkAPI := strings.HasPrefix(r.URL.Path, shlinkPrefix)
		if shlinkAPI {
			shlinkCORS(rec.Header())
		}
		fail := writeError
		switch {
		case shlinkAPI:
			fail = writeShlinkError
		case strings.HasPrefix(r.URL.Path, bitlyPrefix):
			// Bitly's clients read its error shape only.
			fail = func(w http.ResponseWriter, requestID string, e *apiError) {
				writeBitlyError(w, requestID, bitlyResource(r.URL.Path), e)
			}
		}
		if e := a.checkShape(r); e != nil {
			fail(rec, st.id, e)
			return
		}
		if shlinkAPI && r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			st.route = shlinkPreflightRoute
			shlinkPreflight(rec)
			return
		}
		if !bitlyPath(r) {
			fail(rec, st.id, notFound(bitlyNotServed))
			return
		}
		if _, pattern := mux.Handler(r); pattern != "" {
			st.route = pattern
			// The mux sets Pattern on the copy it is given: the request
			// duration histogram and the span are per route too.
			outer.Pattern = pattern
			mux.ServeHTTP(rec, r)
			return
		}
		fail(rec, st.id, unmatched(mux, r))
	})
}

// checkShape refuses requests too big in their line or headers, and paths
// that are not canonical (empty, "." or ".." segments, decoded or not), which
// the mux would otherwise answer with a redirect.
func (a *API) checkShape(r *http.Request) *apiError {
	if len(r.RequestURI) > maxURIBytes {
		return newError(http.StatusRequestURITooLong, codeURITooLong,
			fmt.Sprintf("the request target is longer than %d bytes", maxURIBytes))
	}
	n := 0
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4 // ": " and CRLF
		}
	}
	if n > a.opts.MaxHeaderBytes {
		return newError(http.StatusRequestHeaderFieldsTooLarge, codeHeadersTooLarge,
			fmt.Sprintf("the request's header fields take %d bytes; the limit is %d", n, a.opts.MaxHeaderBytes))
	}
	if e := checkPreconditions(r); e != nil {
		return e
	}
	p := r.URL.Path
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	if p == "" || p[0] != '/' || clean != p {
		return badRequest("the path is not canonical: it has empty, '.' or '..' segments (percent-encoded or not)")
	}
	return nil
}

// checkPreconditions refuses a write that asks for a precondition no route
// evaluates (conditional.go): If-Unmodified-Since (the API sends no
// Last-Modified; update times are finer than HTTP dates) and If-None-Match
// on a write (the resources a write targets exist, or are made by it).
// They were ignored, and the write applied over whatever had changed
// meanwhile, while the client believed it was guarded (RFC 9110: 412).
// If-Match is the route's (ifMatch): a link's PATCH and DELETE check it.
func checkPreconditions(r *http.Request) *apiError {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return nil
	}
	var asked string
	switch {
	case r.Header.Get("If-Unmodified-Since") != "":
		asked = "If-Unmodified-Since"
	case len(r.Header.Values("If-None-Match")) > 0:
		asked = "If-None-Match"
	default:
		return nil
	}
	return newError(http.StatusPreconditionFailed, codePreconditionFailed,
		asked+" cannot hold on a write here: the API applies a write to the fields it names, the last write winning, unless a link's PATCH or DELETE carries If-Match with the link's ETag (docs/api.md, Concurrent changes); send the write without it")
}

// unmatched answers a request no pattern took: 405 with the allowed methods
// when the path exists, else 404. The mux's own answer is consulted for the
// Allow list, then replaced by the uniform error body.
func unmatched(mux *http.ServeMux, r *http.Request) *apiError {
	h, _ := mux.Handler(r)
	p := &probe{header: http.Header{}}
	h.ServeHTTP(p, r)
	if p.code == http.StatusMethodNotAllowed {
		allow := p.header.Get("Allow")
		msg := fmt.Sprintf("method %s is not allowed on this path; allowed: %s", r.Method, allow)
		if yourlsPath(r.URL.Path) {
			// YOURLS takes GET; kurz does not, as its signature (an API
			// key) would sit in the URL, which proxies and access logs keep.
			msg = fmt.Sprintf("method %s is not allowed here: POST the parameters (signature included) in the body as application/x-www-form-urlencoded; a key in a URL is kept by proxies and access logs (docs/api.md, YOURLS-compatible API)", r.Method)
		}
		e := newError(http.StatusMethodNotAllowed, codeMethodNotAllowed, msg)
		e.header = http.Header{"Allow": {allow}}
		return e
	}
	if strings.HasPrefix(r.URL.Path, bitlyPrefix) {
		return notFound(bitlyNotServed)
	}
	if strings.HasPrefix(r.URL.Path, shlinkPrefix) {
		return notFound(shlinkNotServed)
	}
	return notFound("no such route; the API is described at /v1/openapi.json")
}

// probe is a ResponseWriter that keeps the status and headers, drops the body.
type probe struct {
	header http.Header
	code   int
}

func (p *probe) Header() http.Header { return p.header }
func (p *probe) Write(b []byte) (int, error) {
	if p.code == 0 {
		p.code = http.StatusOK
	}
	return len(b), nil
}
func (p *probe) WriteHeader(code int) {
	if p.code == 0 {
		p.code = code
	}
}

// observe records one request: the request counter and latency histogram
// (by route pattern) and one log line without secrets.
func (a *API) observe(r *http.Request, status int, st *reqState, took time.Duration) {
	if status == 0 {
		status = http.StatusOK
	}
	ctx := context.WithoutCancel(r.Context())
	a.m.requests.Add(ctx, 1, metric.WithAttributes(attribute.String("route", st.route), attribute.Int("status", status)))
	a.m.duration.Record(ctx, took.Seconds(), metric.WithAttributes(attribute.String("route", st.route)))
	level := slog.LevelInfo
	if slices.Contains(opsRoutes, st.route) {
		level = slog.LevelDebug
	}
	a.log.LogAttrs(ctx, level, "request",
		slog.String("method", r.Method), slog.String("route", st.route), slog.Int("status", status),
		slog.Duration("duration", took), slog.String("request_id", st.id),
		slog.String("tenant", st.tenant), slog.String("ip", st.ip))
}

// requestID returns the request's X-Request-ID when it is sane
// (callmeta.ValidRequestID), else a new random one.
func requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-ID"); callmeta.ValidRequestID(id) {
		return id
	}
	return newRequestID()
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// checkQuery refuses query parameters a route does not take, repeated
// ones, and values that are not text (see isText), naming them.
func checkQuery(r *http.Request, allowed []string) error {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return badRequest("the query string is malformed: " + strings.TrimPrefix(err.Error(), "invalid URL escape "))
	}
	for _, name := range slices.Sorted(maps.Keys(q)) {
		switch {
		case !slices.Contains(allowed, name):
			if len(allowed) == 0 {
				return badRequest(fmt.Sprintf("unknown query parameter %q: this route takes none", name))
			}
			return badRequest(fmt.Sprintf("unknown query parameter %q: this route takes %s", name, strings.Join(allowed, ", ")))
		case len(q[name]) > 1:
			return badRequest(fmt.Sprintf("query parameter %q is given %d times", name, len(q[name])))
		case !isText(q[name][0]):
			return badParameter(name, fmt.Sprintf("query parameter %q must be UTF-8 text without control characters", name))
		}
	}
	return nil
}

// checkPath refuses path values (the pattern's wildcards, by name) that are
// not text (see isText), naming them.
func checkPath(r *http.Request, wildcards []string) error {
	for _, name := range wildcards {
		if !isText(r.PathValue(name)) {
			return badParameter(name, fmt.Sprintf("the %s in the path must be UTF-8 text without control characters", name))
		}
	}
	return nil
}

// isText reports whether s is valid UTF-8 without control characters (C0
// with NUL, DEL, C1). Every path and query value must be: protobuf refuses
// invalid UTF-8 in a string field (the call to a service failed in the
// gateway), PostgreSQL refuses NUL in text, and no name, code, tag or token
// of the API holds either; checking here, for every route, leaves no
// handler to forget it.
func isText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	return !strings.ContainsFunc(s, unicode.IsControl)
}

// pathWildcards returns the names of the wildcards of a mux pattern
// ("GET /v1/webhooks/{webhookId}/deliveries" → webhookId), in order.
func pathWildcards(pattern string) []string {
	var names []string
	for _, seg := range strings.Split(pattern, "/") {
		if name, ok := strings.CutPrefix(seg, "{"); ok {
			name = strings.TrimSuffix(strings.TrimSuffix(name, "}"), "...")
			if name != "$" {
				names = append(names, name)
			}
		}
	}
	return names
}
