package app

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"kurz.dev/pkg/testkit/servertest"
)

// askForwardAuth sends a proxy's forward-auth request (GET, as Traefik
// and Caddy send it) for url with header, and returns the answer, its
// body read into the returned string.
func askForwardAuth(t *testing.T, url string, header http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header.Clone()
	return do(t, req)
}

// Off by default: the HTTP listener is the ops port, and the forward auth
// is not there unless asked for.
func TestForwardAuthIsOffByDefault(t *testing.T) {
	r := startNoRedis(t, nil)
	if resp, body := askForwardAuth(t, r.HTTP+"/forward-auth/race3?d=user=value:k", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("forward auth: %d %q, want 404", resp.StatusCode, body)
	}
}

// With Redis unreachable each rule answers by its failure mode, as for
// Envoy's requests: race3's (open) lets the request through, quota's
// (closed) refuses it, 429 with a Retry-After, or the URL's deny_status.
func TestForwardAuthFollowsTheRulesFailureModes(t *testing.T) {
	r := startNoRedis(t, map[string]string{"KURZ_LIMITER_FORWARD_AUTH": "true"})
	header := http.Header{"X-Key": {"k"}, "X-Forwarded-Method": {"GET"}}
	for _, tc := range []struct {
		target string
		code   int
	}{
		{"/forward-auth/race3?from=traefik&d=user=header:X-Key", http.StatusOK},
		{"/forward-auth/quota?from=traefik&d=api_key=header:X-Key", http.StatusTooManyRequests},
		{"/forward-auth/quota?from=traefik&d=api_key=header:X-Key&deny_status=403", http.StatusForbidden},
	} {
		resp, body := askForwardAuth(t, r.HTTP+tc.target, header)
		if resp.StatusCode != tc.code {
			t.Errorf("%s: %d %q, want %d", tc.target, resp.StatusCode, body, tc.code)
		}
		if denied := tc.code != http.StatusOK; denied != (resp.Header.Get("Retry-After") != "") || denied != strings.Contains(body, "rate limit exceeded") {
			t.Errorf("%s: Retry-After %q, body %q; want both on a refusal only", tc.target, resp.Header.Get("Retry-After"), body)
		}
	}
}

// Caddy's forward_auth sends a clone of the client's request, its Host
// included, unless the README's `header_up Host {upstream_hostport}` says
// otherwise: the HTTP listener is the ops port, whose Host check refuses
// the site's name (421, which Caddy would hand every client), and answers
// the limiter's own address, which nginx and Traefik send by themselves.
func TestForwardAuthNeedsTheLimitersHostFromCaddy(t *testing.T) {
	r := startNoRedis(t, map[string]string{"KURZ_LIMITER_FORWARD_AUTH": "true"})
	for host, want := range map[string]int{"shop.example": http.StatusMisdirectedRequest, "": http.StatusOK} {
		req, err := http.NewRequest(http.MethodGet, r.HTTP+"/forward-auth/nodomain?from=caddy&d=remote_address", nil)
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
		req.Header = http.Header{"X-Forwarded-Method": {"GET"}, "X-Forwarded-Uri": {"/"}, "X-Forwarded-Host": {"shop.example"}, "X-Forwarded-For": {"203.0.113.9"}}
		if resp, body := do(t, req); resp.StatusCode != want {
			t.Errorf("Host %q: %d %q, want %d", req.Host, resp.StatusCode, body, want)
		}
	}
}

// A proxy passes its client's headers on to the forward auth, traceparent
// included: the limiter traces the request, but never continues a trace
// the client chose (which would let it choose which requests are sampled
// and put trace IDs of its own into the limiter's log lines), as the
// gateway's and the redirect's public listeners do not.
func TestForwardAuthContinuesNoClientsTrace(t *testing.T) {
	rules, err := filepath.Abs(filepath.Join("testdata", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := load(t, map[string]string{"KURZ_REDIS_ADDRS": "127.0.0.1:1", "KURZ_REDIS_DIAL_TIMEOUT": "200ms",
		"KURZ_LIMITER_RULES_SOURCE": "file", "KURZ_LIMITER_RULES_FILE": rules, "KURZ_LIMITER_FORWARD_AUTH": "true"})
	rec := tracetest.NewSpanRecorder()
	cfg.Telemetry.SpanProcessor = rec
	srv, err := New(context.Background(), cfg, servertest.Logger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "envoy.service.ratelimit.v3.RateLimitService")

	const clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	resp, body := askForwardAuth(t, r.HTTP+"/forward-auth/race3?from=traefik&d=user=header:X-Key", http.Header{
		"X-Key": {"k"}, "X-Forwarded-Method": {"GET"}, "Traceparent": {"00-" + clientTrace + "-00f067aa0ba902b7-01"},
	})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("forward auth: %d %q, want 200", resp.StatusCode, body)
	}
	if err := r.Stop(); err != nil { // ends every span
		t.Fatal(err)
	}
	servers := 0
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindServer {
			servers++
		}
		if s.SpanContext().TraceID().String() == clientTrace {
			t.Errorf("span %q continues the client's trace %s", s.Name(), clientTrace)
		}
	}
	if servers == 0 {
		t.Error("no server span for the forward-auth request: want it traced")
	}
}
