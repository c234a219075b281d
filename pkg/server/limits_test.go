package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"kurz.dev/pkg/server"
	"kurz.dev/pkg/testkit/servertest"
)

// start runs a bare server (ops routes only) with these listener bounds.
func start(t *testing.T, limits server.HTTPLimits) *servertest.Running {
	t.Helper()
	log := servertest.Logger(t)
	srv, err := server.New(context.Background(), "limits-test",
		server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", HTTP: limits}, server.NewLifecycle(log, 0), log)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return servertest.Start(t, srv)
}

// healthy fails the test unless a well-behaved client gets /healthz.
func healthy(t *testing.T, r *servertest.Running, when string) {
	t.Helper()
	resp, err := http.Get(r.HTTP + "/healthz")
	if err != nil {
		t.Fatalf("%s: GET /healthz: %v", when, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: GET /healthz: %d, want 200", when, resp.StatusCode)
	}
}

// Requests no client library would send get net/http's 4xx/5xx and the
// connection closed, and the server goes on serving.
func TestMalformedRequestGetsItsStatusAndTheConnectionClosed(t *testing.T) {
	r := start(t, server.HTTPLimits{})
	addr := strings.TrimPrefix(r.HTTP, "http://")
	for _, tc := range servertest.MalformedRequests {
		t.Run(tc.Name, func(t *testing.T) {
			got, err := servertest.RawExchange(addr, tc.Raw, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != tc.Want || !got.Closed {
				t.Errorf("got %d, closed=%v after %v; want %d and the connection closed", got.Status, got.Closed, got.After, tc.Want)
			}
			healthy(t, r, "after "+tc.Name)
		})
	}
}

// A header block up to MaxHeaderBytes (default 64 KiB) is read; past it
// (plus the 4 KiB net/http reads before deciding) the answer is 431 and the
// connection is closed.
func TestHeaderOverMaxHeaderBytesGets431(t *testing.T) {
	r := start(t, server.HTTPLimits{})
	addr := strings.TrimPrefix(r.HTTP, "http://")
	for _, tc := range []struct {
		size       int
		want       int
		wantClosed bool
	}{
		{server.DefaultMaxHeaderBytes - 1024, http.StatusOK, false},
		{server.DefaultMaxHeaderBytes + 8<<10, http.StatusRequestHeaderFieldsTooLarge, true},
	} {
		req := fmt.Sprintf("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("b", tc.size))
		got, err := servertest.RawExchange(addr, req, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != tc.want || got.Closed != tc.wantClosed {
			t.Errorf("%d-byte header: %d closed=%v; want %d closed=%v", tc.size, got.Status, got.Closed, tc.want, tc.wantClosed)
		}
	}
}

// A client that trickles its header (slowloris) is disconnected once
// ReadHeaderTimeout has passed (net/http answers a half-read header with a
// bare 400 as it closes).
func TestSlowHeaderIsCutAtReadHeaderTimeout(t *testing.T) {
	const rht = 300 * time.Millisecond
	r := start(t, server.HTTPLimits{ReadHeaderTimeout: rht})
	addr := strings.TrimPrefix(r.HTTP, "http://")
	got, err := servertest.Trickle(addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n", "X-Slow: 1\r\n", 20*time.Millisecond, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Closed || got.After < rht || got.After > rht+time.Second || (got.Status != 0 && got.Status != http.StatusBadRequest) {
		t.Errorf("slow header: %d closed=%v after %v; want closed in [%v, %v], with no answer or a 400", got.Status, got.Closed, got.After, rht, rht+time.Second)
	}
	healthy(t, r, "after the slow header")
}

// A body sent a byte at a time to a route that reads it is cut once
// ReadTimeout has passed since the request began. (One the route does not
// read is not waited for at all: TestUnreadSlowBodiesDoNotHoldTheListener.)
func TestSlowBodyIsCutAtReadTimeout(t *testing.T) {
	const rt = 500 * time.Millisecond
	r := startWith(t, server.Config{HTTP: server.HTTPLimits{ReadTimeout: rt}}, func(s *server.Server) {
		s.Mux.HandleFunc("POST /read", func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.Copy(io.Discard, r.Body); err != nil {
				http.Error(w, "the request body could not be read", http.StatusBadRequest)
			}
		})
	})
	addr := strings.TrimPrefix(r.HTTP, "http://")
	got, err := servertest.Trickle(addr, "POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 4096\r\n\r\n", "{", 20*time.Millisecond, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != http.StatusBadRequest || !got.Closed || got.After < rt || got.After > rt+time.Second {
		t.Errorf("slow body: %d closed=%v after %v; want 400 and closed in [%v, %v]", got.Status, got.Closed, got.After, rt, rt+time.Second)
	}
	healthy(t, r, "after the slow body")
}

// A keep-alive connection with no next request is closed once IdleTimeout
// has passed.
func TestIdleConnectionIsClosedAtIdleTimeout(t *testing.T) {
	const idle = 300 * time.Millisecond
	r := start(t, server.HTTPLimits{IdleTimeout: idle})
	addr := strings.TrimPrefix(r.HTTP, "http://")
	got, err := servertest.RawExchange(addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != http.StatusOK || !got.Closed || got.After < idle || got.After > idle+time.Second {
		t.Errorf("idle connection: %d closed=%v after %v; want 200 and closed in [%v, %v]", got.Status, got.Closed, got.After, idle, idle+time.Second)
	}
}

// A gRPC request over the receive bound (4 MiB) is refused with
// RESOURCE_EXHAUSTED and counted in kurz_grpc_calls_refused_total (reason
// too_large), and the server goes on serving.
func TestGRPCRequestOverMaxRecvMsgSizeIsResourceExhausted(t *testing.T) {
	r := start(t, server.HTTPLimits{})
	health := healthpb.NewHealthClient(r.Conn)
	ctx := context.Background()
	_, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: strings.Repeat("s", 5<<20)})
	if got := status.Code(err); got != codes.ResourceExhausted {
		t.Errorf("5 MiB request: %v (%v), want ResourceExhausted", got, err)
	}
	// Counted as the handler reads the request (gRPC refuses it there).
	if !servertest.Eventually(5*time.Second, func() bool {
		return servertest.HasSeries(metricsPage(t, r.HTTP+"/metrics"), "kurz_grpc_calls_refused_total", `reason="too_large"`)
	}) {
		t.Errorf("no kurz_grpc_calls_refused_total{reason=\"too_large\"} after a 5 MiB request")
	}
	// Just under the bound is read (and answered: no such service).
	_, err = health.Check(ctx, &healthpb.HealthCheckRequest{Service: strings.Repeat("s", server.DefaultGRPCMaxRecvMsgSize-64)})
	if got := status.Code(err); got != codes.NotFound {
		t.Errorf("request just under 4 MiB: %v (%v), want NotFound (read, no such service)", got, err)
	}
	if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health check after the oversized request: %v", err)
	}
}
