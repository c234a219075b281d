package grpcclient_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"kurz.dev/pkg/grpcclient"
	"kurz.dev/pkg/telemetry"
	"kurz.dev/pkg/testkit/servertest"
)

// replica is an in-process gRPC server with a health service that counts
// the Check calls it answers.
type replica struct {
	addr   string
	health *health.Server
	calls  atomic.Int64
}

func startReplica(t *testing.T) *replica {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{addr: lis.Addr().String(), health: health.NewServer()}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		r.calls.Add(1)
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, r.health)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return r
}

// A comma-separated target spreads calls over every replica, and a replica
// that reports NOT_SERVING (draining) gets no new calls.
func TestListTargetSpreadsAndSkipsDrainingReplicas(t *testing.T) {
	a, b := startReplica(t), startReplica(t)
	tel, err := telemetry.Setup(context.Background(), telemetry.Config{}, "test", "test")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpcclient.Dial(a.addr+", "+b.addr, tel)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	call := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
	}
	// round_robin picks only READY subchannels: until b's connection is up
	// (on a loaded machine, after a's), every call goes to a. So keep
	// calling until both have answered.
	spread := servertest.Eventually(10*time.Second, func() bool {
		call()
		return a.calls.Load() > 0 && b.calls.Load() > 0
	})
	if !spread {
		t.Fatalf("calls not spread: %d and %d", a.calls.Load(), b.calls.Load())
	}

	a.health.Shutdown() // NOT_SERVING, as a replica does on SIGTERM
	// The client learns it through its health watch; then a gets nothing.
	deadline := time.Now().Add(10 * time.Second)
	for {
		before := a.calls.Load()
		for range 10 {
			call()
		}
		if a.calls.Load() == before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a NOT_SERVING replica still gets calls after 10 s")
		}
	}
	before := a.calls.Load()
	for range 20 {
		call()
	}
	if got := a.calls.Load() - before; got != 0 {
		t.Fatalf("a draining replica got %d of 20 new calls", got)
	}
}

// With no replica serving, a call on a connection dialled WaitForReplica
// (the gateway's to the shortener and analytics) waits for one within its
// deadline and succeeds once a replica is back, while a call on a plain
// connection (the limiter's) fails at once with UNAVAILABLE so that its
// caller can apply the rule's failure mode.
func TestWaitForReplicaWaitsPlainConnectionsFailFast(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := health.NewServer()
	// Every method of every other service answers an empty message.
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		if err := stream.RecvMsg(&emptypb.Empty{}); err != nil {
			return err
		}
		return stream.SendMsg(&emptypb.Empty{})
	}))
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	hs.Shutdown() // NOT_SERVING: the only replica is draining

	tel, err := telemetry.Setup(context.Background(), telemetry.Config{}, "test", "test")
	if err != nil {
		t.Fatal(err)
	}
	dial := func(opts ...grpc.DialOption) *grpc.ClientConn {
		t.Helper()
		conn, err := grpcclient.Dial(lis.Addr().String(), tel, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		// The connection learns the replica is NOT_SERVING from its health watch.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn.Connect()
		for s := conn.GetState(); s != connectivity.TransientFailure; s = conn.GetState() {
			if !conn.WaitForStateChange(ctx, s) {
				t.Fatalf("connection state %v after 10 s, want TRANSIENT_FAILURE (replica NOT_SERVING)", s)
			}
		}
		return conn
	}
	invoke := func(conn *grpc.ClientConn, method string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return conn.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{})
	}
	waiting, plain := dial(grpcclient.WaitForReplica), dial()

	waited := make(chan error, 1)
	go func() { waited <- invoke(waiting, "/kurz.shortener.v1.ShortenerService/GetLink") }()
	if err := invoke(plain, "/kurz.ratelimit.v1.RateLimitService/CheckQuota"); status.Code(err) != codes.Unavailable {
		t.Errorf("limiter call with no replica serving: %v, want UNAVAILABLE at once", err)
	}
	hs.Resume()
	if err := <-waited; err != nil {
		t.Errorf("shortener call with the replica back within its deadline: %v, want success", err)
	}
	if err := invoke(waiting, "/kurz.analytics.v1.AnalyticsService/GetLinkStats"); err != nil {
		t.Errorf("analytics call: %v", err)
	}
}

// pingCounter is a listener whose connections count the HTTP/2 PING
// frames (not acknowledgements) their client sends.
type pingCounter struct {
	net.Listener
	pings atomic.Int64
}

func (l *pingCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return servertest.CountPings(c, false, &l.pings), nil
}

// Calls one at a time cost no flow-control pings: with gRPC's dynamic
// windows the client pings after every answer to estimate the bandwidth,
// a third write per call on both sides (the limiter's c=1 figures).
func TestSequentialCallsSendNoPings(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pc := &pingCounter{Listener: lis}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(pc) }()
	t.Cleanup(srv.Stop)
	tel, err := telemetry.Setup(context.Background(), telemetry.Config{}, "test", "test")
	if err != nil {
		t.Fatal(err)
	}
	// Dial's connection first: the server may still be reading the other's
	// pings after its client closed it.
	for _, tc := range []struct {
		name string
		dial func() (*grpc.ClientConn, error)
	}{
		{"Dial", func() (*grpc.ClientConn, error) { return grpcclient.Dial(lis.Addr().String(), tel) }},
		// The same server with gRPC's defaults: the test sees pings.
		{"grpc defaults", func() (*grpc.ClientConn, error) {
			return grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		}},
	} {
		name := tc.name
		conn, err := tc.dial()
		if err != nil {
			t.Fatal(err)
		}
		before := pc.pings.Load()
		client := healthpb.NewHealthClient(conn)
		for range 50 {
			if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatal(err)
			}
		}
		conn.Close()
		got := pc.pings.Load() - before
		if name == "Dial" && got != 0 {
			t.Errorf("%s: 50 calls one at a time sent %d pings, want none", name, got)
		}
		if name != "Dial" && got == 0 {
			t.Errorf("%s: 50 calls sent no ping: the counter sees nothing, so Dial's zero proves nothing", name)
		}
	}
}

// A target gRPC cannot use was taken and dialled for good: without a port
// grpc-go's DNS resolver dials port 443, and an unknown scheme or an empty
// list resolves to nothing. Callers ran with their limiter "degraded" (API
// quotas and redirect bounds failing open) until someone read the logs.
func TestDialRefusesTargetsItCannotUse(t *testing.T) {
	tel, err := telemetry.Setup(context.Background(), telemetry.Config{}, "test", "test")
	if err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{"127.0.0.1:9091", "limiter:9091", "dns:///limiter-headless:9091", "dns://10.0.0.10:53/limiter:9091", "127.0.0.1:9091, 127.0.0.1:9092", "unix:///tmp/limiter.sock", "passthrough:///limiter:9091"} {
		conn, err := grpcclient.Dial(ok, tel)
		if err != nil {
			t.Errorf("Dial(%q) = %v, want a connection", ok, err)
			continue
		}
		_ = conn.Close()
	}
	for target, want := range map[string]string{
		"127.0.0.1":                "host:port",
		"dns:///limiter-headless":  "host:port",
		"127.0.0.1:9091,127.0.0.1": "host:port",
		",,":                       "no address",
		"bogus://limiter:9091":     `scheme "bogus"`,
		"limiter:9091 ":            "host:port",
	} {
		conn, err := grpcclient.Dial(target, tel)
		if err == nil {
			_ = conn.Close()
			t.Errorf("Dial(%q) made a connection, want an error saying %s", target, want)
			continue
		}
		if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), target) {
			t.Errorf("Dial(%q) = %v, want the target and %s", target, err, want)
		}
	}
}

// gRPC's targets without "//" (its naming doc's unix:path and
// dns:host:port, which grpc-go dials) were refused at start since the
// target checks came in: checkTarget took them for a host "unix" or "dns"
// with a port that is not a number. They are taken as grpc-go parses them,
// and a dns one still needs its port.
func TestDialTakesGRPCTargetsWithoutSlashes(t *testing.T) {
	tel, err := telemetry.Setup(context.Background(), telemetry.Config{}, "test", "test")
	if err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{"unix:/run/kurz/limiter.sock", "unix:limiter.sock", "unix-abstract:kurz-limiter", "dns:limiter:9091", "dns:[::1]:9091"} {
		conn, err := grpcclient.Dial(ok, tel)
		if err != nil {
			t.Errorf("Dial(%q) = %v, want a connection (a target grpc-go dials)", ok, err)
			continue
		}
		_ = conn.Close()
	}
	for _, bad := range []string{"dns:limiter", "dns:user:hunter2@limiter:9091"} {
		conn, err := grpcclient.Dial(bad, tel)
		if err == nil {
			_ = conn.Close()
			t.Errorf("Dial(%q) made a connection, want an error saying host:port", bad)
			continue
		}
		if !strings.Contains(err.Error(), "host:port") || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Dial(%q) = %v, want an error saying host:port, without the password", bad, err)
		}
	}
}

// A target holding credentials is refused without repeating them.
func TestDialHidesCredentialsOfARefusedTarget(t *testing.T) {
	tel, err := telemetry.Setup(context.Background(), telemetry.Config{}, "test", "test")
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"user:hunter2@limiter:9091", "a:1,user:hunter2@limiter:9091", "dns:///user:hunter2@limiter:9091", "bogus://user:hunter2@limiter:9091", "dns:///limiter:9091?token=hunter2", "limiter:9091?token=hunter2"} {
		conn, err := grpcclient.Dial(target, tel)
		if err == nil {
			_ = conn.Close()
			t.Errorf("Dial(%q) made a connection", target)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Dial(%q) = %v, repeats the password", target, err)
		}
	}
}
