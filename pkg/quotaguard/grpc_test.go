package quotaguard_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/quotaguard"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/pkg/testkit/limitertest"
)

// guardedHealth is a health service behind the interceptors: it records the
// decision each call it serves carries.
type guardedHealth struct {
	healthpb.UnimplementedHealthServer
	mu     sync.Mutex
	served []quota.Decision
}

func (h *guardedHealth) record(ctx context.Context) {
	d, _ := quotaguard.DecisionFrom(ctx)
	h.mu.Lock()
	h.served = append(h.served, d)
	h.mu.Unlock()
}

func (h *guardedHealth) Served() []quota.Decision {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]quota.Decision(nil), h.served...)
}

func (h *guardedHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.record(ctx)
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (h *guardedHealth) Watch(_ *healthpb.HealthCheckRequest, s grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	h.record(s.Context())
	return s.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
}

// byCaller keys every call by its metadata "x-user", its peer and method.
var byCaller = quotaguard.CallDescriptors(map[string]quotaguard.CallSource{
	"user": quotaguard.Metadata("x-user"), "ip": quotaguard.PeerIP(clientip.Keying{}), "method": quotaguard.FullMethod,
})

// serveGuarded runs the guarded health service with o over c, and returns
// a client of it.
func serveGuarded(t *testing.T, c *quota.Client, o quotaguard.CallOptions) (healthpb.HealthClient, *guardedHealth) {
	t.Helper()
	unary, err := quotaguard.UnaryServerInterceptor(c, o)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := quotaguard.StreamServerInterceptor(c, o)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))
	h := &guardedHealth{}
	healthpb.RegisterHealthServer(srv, h)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn), h
}

func asUser(user string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "x-user", user)
}

// result is a call's header metadata and error.
type result struct {
	md  metadata.MD
	err error
}

// call makes a unary call and a stream, as user, and returns the result of
// each ("unary", "stream").
func call(t *testing.T, hc healthpb.HealthClient, user string) map[string]result {
	t.Helper()
	var unary, stream result
	_, unary.err = hc.Check(asUser(user), &healthpb.HealthCheckRequest{}, grpc.Header(&unary.md))
	ctx, cancel := context.WithCancel(asUser(user))
	defer cancel()
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, stream.err = w.Recv()
	stream.md, _ = w.Header()
	return map[string]result{"unary": unary, "stream": stream}
}

func TestAllowedCallCarriesTheRuleFields(t *testing.T) {
	lim := limitertest.Start(t, decide(41, 0, 0))
	hc, h := serveGuarded(t, newClient(t, lim.Addr()), quotaguard.CallOptions{Domain: "api", Descriptors: byCaller})
	for kind, got := range call(t, hc, "alice") {
		if got.err != nil {
			t.Errorf("%s: %v, want it served", kind, got.err)
		}
		if p, s := got.md.Get("ratelimit-policy"), got.md.Get("ratelimit"); len(p) != 1 || p[0] != `"api/per-user";q=100;w=60` ||
			len(s) != 1 || s[0] != `"api/per-user";r=41;t=36` {
			t.Errorf("%s header metadata %v: want the rule's fields", kind, got.md)
		}
	}
	if served := h.Served(); len(served) != 2 || served[0].Rule != "per-user" || served[1].Rule != "per-user" {
		t.Errorf("served with decisions %+v, want the limiter's two", served)
	}
	want := map[string]string{"user": "alice", "ip": "127.0.0.1", "method": "/grpc.health.v1.Health/Check"}
	calls := lim.Calls()
	if len(calls) != 2 {
		t.Fatalf("%d checks, want 2", len(calls))
	}
	for k, v := range want {
		if got := calls[0].GetDescriptors()[k]; got != v {
			t.Errorf("descriptor %s: got %q, want %q", k, got, v)
		}
	}
	if got := calls[1].GetDescriptors()["method"]; got != "/grpc.health.v1.Health/Watch" {
		t.Errorf("the stream's method descriptor: %q", got)
	}
}

func TestDeniedCallIsResourceExhaustedWithRetryInfo(t *testing.T) {
	lim := limitertest.Start(t, decide(-1, 2500*time.Millisecond, 0))
	hc, h := serveGuarded(t, newClient(t, lim.Addr()), quotaguard.CallOptions{Domain: "api", Descriptors: byCaller})
	for kind, got := range call(t, hc, "alice") {
		if c := status.Code(got.err); c != codes.ResourceExhausted {
			t.Errorf("%s: %v, want RESOURCE_EXHAUSTED", kind, got.err)
		}
		info, _, retry := rpcerr.Details(got.err)
		if info.GetReason() != rpcerr.ReasonRateLimited || info.GetMetadata()["rule"] != "per-user" {
			t.Errorf("%s ErrorInfo %v: want RATE_LIMITED, rule per-user", kind, info)
		}
		if d := retry.GetRetryDelay().AsDuration(); d != 3*time.Second {
			t.Errorf("%s RetryInfo %v: want 3s", kind, d)
		}
		if s := got.md.Get("ratelimit"); len(s) != 1 || s[0] != `"api/per-user";r=0;t=60` {
			t.Errorf("%s header metadata %v: want the denying rule's fields", kind, got.md)
		}
	}
	if served := h.Served(); len(served) != 0 {
		t.Errorf("%d denied calls served", len(served))
	}
}

func TestCallsWhenTheLimiterIsDown(t *testing.T) {
	c := newClient(t, deadAddr(t))
	t.Run("fail open passes", func(t *testing.T) {
		hc, h := serveGuarded(t, c, quotaguard.CallOptions{Domain: "api", Descriptors: byCaller, Policy: quota.FailOpen})
		for kind, got := range call(t, hc, "alice") {
			if got.err != nil {
				t.Errorf("%s: %v, want it served", kind, got.err)
			}
		}
		if served := h.Served(); len(served) != 2 || !served[0].Degraded || !served[1].Degraded {
			t.Errorf("served with %+v: want two decisions marked Degraded", served)
		}
	})
	t.Run("fail closed denies", func(t *testing.T) {
		hc, h := serveGuarded(t, c, quotaguard.CallOptions{Domain: "api", Descriptors: byCaller, Policy: quota.FailClosed})
		for kind, got := range call(t, hc, "alice") {
			err := got.err
			info, _, retry := rpcerr.Details(err)
			if status.Code(err) != codes.Unavailable || info.GetReason() != rpcerr.ReasonLimiterUnavailable ||
				retry.GetRetryDelay().AsDuration() != time.Second {
				t.Errorf("%s: %v (%v, %v), want UNAVAILABLE, RATE_LIMITER_UNAVAILABLE, retry after 1s", kind, err, info, retry)
			}
		}
		if served := h.Served(); len(served) != 0 {
			t.Errorf("%d calls served", len(served))
		}
	})
}

func TestSkippedCallsAndCost(t *testing.T) {
	lim := limitertest.Start(t, limitertest.AllowAll)
	hc, h := serveGuarded(t, newClient(t, lim.Addr()), quotaguard.CallOptions{Domain: "api",
		Descriptors: func(ctx context.Context, method string) (map[string]string, bool) {
			return map[string]string{"user": "alice"}, !strings.HasSuffix(method, "/Watch")
		},
		Cost: func(context.Context, string) uint32 { return 7 },
	})
	for kind, got := range call(t, hc, "alice") {
		if got.err != nil {
			t.Fatalf("%s: %v, want it served", kind, got.err)
		}
	}
	if calls := lim.Calls(); len(calls) != 1 || calls[0].GetCost() != 7 {
		t.Errorf("checks %v: want one, of the unary call, costing 7", calls)
	}
	if served := h.Served(); len(served) != 2 {
		t.Errorf("%d calls served, want 2", len(served))
	}
}

func TestInterceptorsRefuseAnIncompleteSetup(t *testing.T) {
	c := newClient(t, deadAddr(t))
	for name, o := range map[string]quotaguard.CallOptions{
		"no domain":      {Descriptors: byCaller},
		"no descriptors": {Domain: "api"},
	} {
		if _, err := quotaguard.UnaryServerInterceptor(c, o); err == nil {
			t.Errorf("unary, %s: no error", name)
		}
		if _, err := quotaguard.StreamServerInterceptor(c, o); err == nil {
			t.Errorf("stream, %s: no error", name)
		}
	}
}

// As TestOverlongQueueWaitIsRefused, for gRPC.
func TestOverlongQueueWaitIsRefusedCall(t *testing.T) {
	lim := limitertest.Start(t, decide(10, 0, time.Hour))
	hc, h := serveGuarded(t, newClient(t, lim.Addr()), quotaguard.CallOptions{Domain: "api", Descriptors: byCaller})
	// The deadline only ends a guard that waits: it decides nothing.
	ctx, cancel := context.WithTimeout(asUser("alice"), 10*time.Second)
	defer cancel()
	_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
	_, _, retry := rpcerr.Details(err)
	if status.Code(err) != codes.ResourceExhausted || retry.GetRetryDelay().AsDuration() != time.Hour || len(h.Served()) != 0 {
		t.Errorf("%v (retry %v), %d served: want RESOURCE_EXHAUSTED retrying after 1h, nothing served", err, retry.GetRetryDelay().AsDuration(), len(h.Served()))
	}
}
