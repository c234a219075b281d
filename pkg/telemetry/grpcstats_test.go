package telemetry

import (
	"context"
	"io"
	"net"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/emptypb"
)

// echo is a one-method service: Call fails with NOT_FOUND when the caller's
// metadata asks for it, and reports the trace it runs in.
type echo struct{ seen chan trace.SpanContext }

func (e *echo) call(ctx context.Context, fail bool) (*emptypb.Empty, error) {
	e.seen <- trace.SpanContextFromContext(ctx)
	if fail {
		return nil, status.Error(codes.NotFound, "no such thing")
	}
	return &emptypb.Empty{}, nil
}

var echoDesc = grpc.ServiceDesc{
	ServiceName: "test.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Ok", Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			return srv.(*echo).call(ctx, false)
		}},
		{MethodName: "Fail", Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			return srv.(*echo).call(ctx, true)
		}},
	},
}

// pair serves echo and health instrumented by server (as pkg/server does)
// and dials it with client's instrumentation.
func pair(t *testing.T, server, client *Telemetry) (*grpc.ClientConn, *echo) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	calls := server.GRPCServer()
	var opts []grpc.ServerOption
	if h := calls.StatsHandler(); h != nil {
		opts = append(opts, grpc.StatsHandler(h))
	}
	srv := grpc.NewServer(opts...)
	e := &echo{seen: make(chan trace.SpanContext, 10)}
	srv.RegisterService(calls.Wrap(&echoDesc), e)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///buf", append(client.GRPCClientOptions(),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn, e
}

func setup(t *testing.T, cfg Config, name string) *Telemetry {
	t.Helper()
	tel, err := Setup(context.Background(), cfg, name, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	return tel
}

func scrape(t *testing.T, tel *Telemetry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	tel.Metrics.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

func invoke(t *testing.T, ctx context.Context, conn *grpc.ClientConn, method string) error {
	t.Helper()
	return conn.Invoke(ctx, "/test.Echo/"+method, &emptypb.Empty{}, &emptypb.Empty{})
}

func TestGRPCDurationsByMethodAndStatus(t *testing.T) {
	srvTel, cliTel := setup(t, Config{}, "srv"), setup(t, Config{}, "cli")
	conn, e := pair(t, srvTel, cliTel)
	ctx := context.Background()
	for range 3 {
		if err := invoke(t, ctx, conn, "Ok"); err != nil {
			t.Fatal(err)
		}
		<-e.seen
	}
	if err := invoke(t, ctx, conn, "Fail"); status.Code(err) != codes.NotFound {
		t.Fatalf("Fail: got %v, want NOT_FOUND", err)
	}
	<-e.seen
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		tel  *Telemetry
		name string
		want []string
	}{
		{srvTel, "rpc_server_call_duration_seconds_count", []string{
			`rpc_method="test.Echo/Ok",rpc_response_status_code="OK",rpc_system_name="grpc"} 3`,
			// NOT_FOUND is the caller's fault: no error.type on the server.
			`rpc_method="test.Echo/Fail",rpc_response_status_code="NOT_FOUND",rpc_system_name="grpc"} 1`,
		}},
		{cliTel, "rpc_client_call_duration_seconds_count", []string{
			`rpc_method="test.Echo/Ok",rpc_response_status_code="OK",rpc_system_name="grpc"} 3`,
			`error_type="NOT_FOUND",`,
		}},
	} {
		// A server records a call's end after its answer went out: poll
		// until every series is there, or give up after a few seconds.
		var all string
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			var lines []string
			for _, l := range strings.Split(scrape(t, c.tel), "\n") {
				if strings.HasPrefix(l, c.name+"{") {
					lines = append(lines, l)
				}
			}
			all = strings.Join(lines, "\n")
			missing := slices.ContainsFunc(c.want, func(w string) bool { return !strings.Contains(all, w) })
			if !missing || time.Now().After(deadline) {
				break
			}
		}
		for _, w := range c.want {
			if !strings.Contains(all, w) {
				t.Errorf("%s: no series with %s; got:\n%s", c.name, w, all)
			}
		}
		if strings.Contains(all, "grpc.health.v1") {
			t.Errorf("%s: health checks are recorded:\n%s", c.name, all)
		}
	}
}

func TestGRPCSpansOnlyWhenRecorded(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	srvTel := setup(t, Config{SpanProcessor: rec}, "srv")
	if !srvTel.Tracing {
		t.Fatal("a span processor does not turn tracing on")
	}
	cliTel := setup(t, Config{}, "cli")
	if cliTel.Tracing {
		t.Fatal("tracing on without an exporter")
	}
	conn, e := pair(t, srvTel, cliTel)

	// The caller's sampled trace reaches the server through a client that
	// records no spans itself.
	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), parent)
	if err := invoke(t, ctx, conn, "Ok"); err != nil {
		t.Fatal(err)
	}
	if got := <-e.seen; got.TraceID() != parent.TraceID() {
		t.Errorf("server span in trace %s, want the caller's %s", got.TraceID(), parent.TraceID())
	}
	// The server span ends after the answer went out.
	ended := rec.Ended()
	for deadline := time.Now().Add(5 * time.Second); len(ended) == 0 && time.Now().Before(deadline); ended = rec.Ended() {
		time.Sleep(10 * time.Millisecond)
	}
	if len(ended) != 1 || ended[0].Name() != "test.Echo/Ok" || ended[0].Parent().SpanID() != parent.SpanID() {
		t.Fatalf("server spans: got %d (%v), want one test.Echo/Ok child of the caller's span", len(ended), ended)
	}
}

func TestGRPCTraceGoesOnWithoutTracing(t *testing.T) {
	srvTel, cliTel := setup(t, Config{}, "srv"), setup(t, Config{}, "cli")
	conn, e := pair(t, srvTel, cliTel)
	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{3}, SpanID: trace.SpanID{4}, TraceFlags: trace.FlagsSampled,
	})
	if err := invoke(t, trace.ContextWithSpanContext(context.Background(), parent), conn, "Ok"); err != nil {
		t.Fatal(err)
	}
	if got := <-e.seen; got.TraceID() != parent.TraceID() || !got.IsSampled() {
		t.Errorf("server context: trace %s sampled=%v, want the caller's %s, sampled", got.TraceID(), got.IsSampled(), parent.TraceID())
	}
}

// A health check made inside a caller's span neither records a span nor
// touches the caller's: otelgrpc, handed a call TagRPC skipped, would take
// the caller's span for the call's and end it.
func TestGRPCHealthChecksLeaveTheCallersSpanAlone(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	cliTel := setup(t, Config{SpanProcessor: rec}, "cli")
	conn, _ := pair(t, setup(t, Config{}, "srv"), cliTel)
	ctx, span := cliTel.TracerProvider.Tracer("test").Start(context.Background(), "caller")
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if !span.IsRecording() || len(rec.Ended()) != 0 {
		t.Fatalf("after a health check: caller's span recording=%v, %d spans ended; want it open and none ended", span.IsRecording(), len(rec.Ended()))
	}
	span.End()
}
