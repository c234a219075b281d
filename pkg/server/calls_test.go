package server_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"kurz.dev/pkg/server"
	"kurz.dev/pkg/testkit/servertest"
)

// A server holds at most GRPCMaxCalls calls over all its connections: one
// more is refused with UNAVAILABLE, whichever connection it comes
// on, and a call that ends gives its place back. The calls held here have
// sent their headers and nothing else, as an attacker's would: each holds
// a goroutine, waiting for a request that never comes. A health check is
// still answered: it is the kubelet's readiness probe, and a full server
// (a slow Redis keeps the limiter's calls open) must not be taken out of
// its Service, every replica at once, for being busy.
func TestGRPCCallsOverTheMaximumAreRefused(t *testing.T) {
	const max = 4
	arrived := make(chan struct{}, max)
	hold := func(_ any, stream grpc.ServerStream) error {
		arrived <- struct{}{}
		<-stream.Context().Done()
		return nil
	}
	pong := func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		in := new(emptypb.Empty)
		return in, dec(in)
	}
	r := startWith(t, server.Config{GRPCMaxCalls: max}, func(s *server.Server) {
		s.RegisterService(&grpc.ServiceDesc{
			ServiceName: "test.Hold",
			HandlerType: (*any)(nil),
			Methods:     []grpc.MethodDesc{{MethodName: "Ping", Handler: pong}},
			Streams:     []grpc.StreamDesc{{StreamName: "Hold", Handler: hold, ClientStreams: true, ServerStreams: true}},
		}, struct{}{})
	})
	silent := &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}
	var held []context.CancelFunc
	for range 2 {
		// Two connections: the bound is the server's, not a connection's.
		conn, err := grpc.NewClient(r.Server.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for range max / 2 {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if _, err := conn.NewStream(ctx, silent, "/test.Hold/Hold"); err != nil {
				t.Fatal(err)
			}
			held = append(held, cancel)
		}
	}
	for range max {
		<-arrived
	}
	// A third client's call is refused while they are held; its health
	// check is answered.
	ping := func() error {
		return r.Conn.Invoke(context.Background(), "/test.Hold/Ping", &emptypb.Empty{}, &emptypb.Empty{})
	}
	err := ping()
	if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "KURZ_GRPC_MAX_CALLS") {
		t.Errorf("call with %d held: %v, want Unavailable naming KURZ_GRPC_MAX_CALLS", max, err)
	}
	health := healthpb.NewHealthClient(r.Conn)
	if resp, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health check with %d calls held: %v, %v; want SERVING: a busy server is still ready", max, resp.GetStatus(), err)
	}
	// Counted before the refusal is sent: on /metrics by now.
	if got := metricValue(t, r.HTTP+"/metrics", "kurz_grpc_calls_refused_total"); got != 1 {
		t.Errorf("kurz_grpc_calls_refused_total %v after one refusal, want 1", got)
	}
	// One ends: its place is given back (when the server has seen it end).
	held[0]()
	if err := retryUntil(t, ping); err != nil {
		t.Errorf("call after one of %d ended: %v, want OK", max, err)
	}
}

// retryUntil calls f until it returns nil or 5 s have passed, and returns
// its last error.
func retryUntil(t *testing.T, f func() error) error {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// metricValue is the sum of the series of family name on the Prometheus
// page at url.
func metricValue(t *testing.T, url, name string) float64 {
	t.Helper()
	var sum float64
	for _, line := range strings.Split(metricsPage(t, url), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		sum += v
	}
	return sum
}

// metricsPage is the Prometheus page at url.
func metricsPage(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// Without a bound of its own, a server holds as many calls as fit a
// quarter of its memory limit each holding a request of its receive size,
// within [4, DefaultGRPCMaxCalls].
func TestGRPCMaxCallsForFitsAQuarterOfTheMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		mem  int64
		recv int
		want int
	}{
		{200 << 20, server.LimiterGRPCMaxRecvMsgSize, 800},
		{200 << 20, 256 << 10, 200},
		{200 << 20, server.SmallGRPCMaxRecvMsgSize, 800},
		{200 << 20, server.DefaultGRPCMaxRecvMsgSize, 12},
		{1 << 40, server.SmallGRPCMaxRecvMsgSize, server.DefaultGRPCMaxCalls}, // no GOMEMLIMIT: math.MaxInt64
		{8 << 20, server.DefaultGRPCMaxRecvMsgSize, 4},
	} {
		if got := server.GRPCMaxCallsFor(c.mem, c.recv); got != c.want {
			t.Errorf("GRPCMaxCallsFor(%d MiB, %d KiB) = %d, want %d", c.mem>>20, c.recv>>10, got, c.want)
		}
		if got := server.GRPCMaxCallsFor(c.mem, c.recv); got > 4 && int64(got)*int64(c.recv) > c.mem/4 {
			t.Errorf("GRPCMaxCallsFor(%d MiB, %d KiB) = %d calls, more than a quarter of the memory", c.mem>>20, c.recv>>10, got)
		}
	}
}

// A server that refuses unsigned calls before reading them counts the small
// size for its derived bound: at a 200 MiB limit the shortener holds 800
// calls, not the 12 its 4 MiB receive bound would leave; one that reads
// every caller's request counts its receive bound.
func TestSignedServersCountStrangersRequestsAsSmall(t *testing.T) {
	const limit = 200 << 20
	if got := server.GRPCMaxCallsFor(limit, server.GRPCStrangerRecvSize(server.DefaultGRPCMaxRecvMsgSize, true)); got != 800 {
		t.Errorf("signed, 4 MiB receive bound: %d calls, want 800", got)
	}
	if got := server.GRPCMaxCallsFor(limit, server.GRPCStrangerRecvSize(server.DefaultGRPCMaxRecvMsgSize, false)); got != 12 {
		t.Errorf("unsigned, 4 MiB receive bound: %d calls, want 12", got)
	}
}

// A service registered on Server.GRPC directly would be neither timed nor
// gated (its calls holding their places on a goroutine each): Run refuses
// to start and names it.
func TestRunRefusesAServiceRegisteredAroundTheServer(t *testing.T) {
	log := servertest.Logger(t)
	srv, err := server.New(context.Background(), "direct-test",
		server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, server.NewLifecycle(log, 0), log)
	if err != nil {
		t.Fatal(err)
	}
	srv.GRPC.RegisterService(&grpc.ServiceDesc{ServiceName: "test.Direct", HandlerType: (*any)(nil)}, struct{}{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Run(ctx); err == nil || !strings.Contains(err.Error(), "test.Direct") || ctx.Err() != nil {
		t.Fatalf("Run: %v (ctx %v), want an immediate error naming test.Direct", err, ctx.Err())
	}
}
