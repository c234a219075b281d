package grpcclient

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"kurz.dev/pkg/telemetry"
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
	conn, err := Dial(a.addr+", "+b.addr, tel)
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
	for range 20 {
		call()
	}
	if a.calls.Load() == 0 || b.calls.Load() == 0 {
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
