package server_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"kurz.dev/pkg/server"
	"kurz.dev/pkg/telemetry"
	"kurz.dev/pkg/testkit/servertest"
)

// closeLog records the closes of a test's resources, in order.
type closeLog struct {
	mu     sync.Mutex
	closed []string
}

// closer returns a close func that records name.
func (c *closeLog) closer(name string) func(context.Context) error {
	return func(context.Context) error {
		c.add(name)
		return nil
	}
}

func (c *closeLog) add(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = append(c.closed, name)
}

func (c *closeLog) got() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.closed)
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// Resources close last owned first; a worker started with Go is stopped
// (its context cancelled, its return awaited) in its place in that order.
func TestLifecycleClosesInReverseOrder(t *testing.T) {
	var log closeLog
	lc := server.NewLifecycle(servertest.Logger(t), 0)
	lc.Own("postgres", log.closer("postgres"))
	lc.OwnCloser("redis", closerFunc(func() error { log.add("redis"); return nil }))
	lc.Go("worker", func(ctx context.Context) {
		<-ctx.Done()
		log.add("worker")
	})
	lc.Own("peer", log.closer("peer"))

	if err := lc.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got, want := log.got(), []string{"peer", "worker", "redis", "postgres"}; !slices.Equal(got, want) {
		t.Errorf("closed %v, want %v", got, want)
	}
}

// A second Close closes nothing again, and a resource owned after Close is
// closed at once, once.
func TestLifecycleClosesEachResourceOnce(t *testing.T) {
	var log closeLog
	lc := server.NewLifecycle(servertest.Logger(t), 0)
	lc.Own("redis", log.closer("redis"))
	if err := lc.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	lc.Own("late", log.closer("late"))
	if err := lc.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if got, want := log.got(), []string{"redis", "late"}; !slices.Equal(got, want) {
		t.Errorf("closed %v, want %v", got, want)
	}
}

// A close that hangs is given up on at the close timeout, named in the
// error; the resources owned before it are still closed.
func TestLifecycleBoundsAHungClose(t *testing.T) {
	var log closeLog
	hung := make(chan struct{})
	defer close(hung)
	lc := server.NewLifecycle(servertest.Logger(t), 50*time.Millisecond)
	lc.Own("redis", log.closer("redis"))
	lc.Own("stuck", func(context.Context) error { <-hung; return nil })
	lc.Own("peer", func(context.Context) error { return errors.New("refused") })

	err := lc.Close(context.Background())
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "close stuck:") {
		t.Errorf("Close: %v; want the stuck close named and timed out", err)
	}
	if err == nil || !strings.Contains(err.Error(), "close peer: refused") {
		t.Errorf("Close: %v; want the peer's error named", err)
	}
	if got, want := log.got(), []string{"redis"}; !slices.Equal(got, want) {
		t.Errorf("closed %v, want %v", got, want)
	}
}

// testConfig is a service configuration: Common and nothing else.
type testConfig struct{ server.Common }

// A Build that fails has what it owned closed, last first, once each, and
// the listeners of the server it built released.
func TestStartClosesWhatAFailedBuildOwned(t *testing.T) {
	var log closeLog
	var addr string
	buildErr := errors.New("limiter: dial refused")
	build := func(ctx context.Context, _ testConfig, lc *server.Lifecycle, l *slog.Logger) (*server.Server, error) {
		lc.Own("redis", log.closer("redis"))
		srv, err := server.New(ctx, "start-test", server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, lc, l)
		if err != nil {
			return nil, err
		}
		addr = srv.GRPCAddr()
		lc.Own("postgres", log.closer("postgres"))
		return nil, buildErr
	}
	srv, err := server.Start(context.Background(), testConfig{}, servertest.Logger(t), build)
	if srv != nil || !errors.Is(err, buildErr) {
		t.Fatalf("Start: %v, %v; want the build's error", srv, err)
	}
	if got, want := log.got(), []string{"postgres", "redis"}; !slices.Equal(got, want) {
		t.Errorf("closed %v, want %v", got, want)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the failed server's gRPC address %s is still held: %v", addr, err)
	}
	_ = lis.Close()
}

// flushRecorder is a span processor that drops spans and records the
// context its Shutdown (the telemetry flush) gets.
type flushRecorder struct {
	mu       sync.Mutex
	calls    int
	err      error
	deadline bool
}

func (*flushRecorder) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (*flushRecorder) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (*flushRecorder) ForceFlush(context.Context) error                { return nil }

func (f *flushRecorder) Shutdown(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.err = ctx.Err()
	_, f.deadline = ctx.Deadline()
	return nil
}

// A drain that uses all of its time leaves the resources' closes and the
// telemetry flush their own deadlines: the flush runs once, last, with a
// live context that still ends.
func TestTelemetryFlushOutlivesASlowDrain(t *testing.T) {
	flush := &flushRecorder{}
	lg := servertest.Logger(t)
	lc := server.NewLifecycle(lg, 0)
	lc.Own("redis", func(ctx context.Context) error { return ctx.Err() })
	srv, err := server.New(context.Background(), "flush-test", server.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		ShutdownTimeout: 50 * time.Millisecond,
		Telemetry:       telemetry.Config{SpanProcessor: flush},
	}, lc, lg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	srv.Mux.HandleFunc("GET /slow", func(http.ResponseWriter, *http.Request) {
		close(entered)
		<-release
	})
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx) }()
	go func() {
		if resp, err := http.Get("http://" + srv.HTTPAddr() + "/slow"); err == nil {
			_ = resp.Body.Close()
		}
	}()
	<-entered
	stop()
	err = <-ran
	if err == nil || !strings.Contains(err.Error(), "drain HTTP") {
		t.Fatalf("Run: %v; want the HTTP drain to time out", err)
	}
	if strings.Contains(err.Error(), "close redis") {
		t.Errorf("Run: %v; want redis closed with a live context", err)
	}
	flush.mu.Lock()
	defer flush.mu.Unlock()
	if flush.calls != 1 || flush.err != nil || !flush.deadline {
		t.Errorf("telemetry flushed %d times, last with ctx.Err() %v, deadline %v; want once, live, bounded",
			flush.calls, flush.err, flush.deadline)
	}
}

// An address in use fails the start naming the variable that moves it.
func TestListenErrorNamesTheVariable(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	log := servertest.Logger(t)
	lc := server.NewLifecycle(log, 0)
	defer lc.Close(context.Background())
	_, err = server.New(context.Background(), "limiter", server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: taken.Addr().String()}, lc, log)
	if err == nil || !strings.Contains(err.Error(), "KURZ_LIMITER_HTTP_ADDR") {
		t.Fatalf("got %v, want an error naming KURZ_LIMITER_HTTP_ADDR", err)
	}
}
