package server

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// At the gRPC listener's cap a newcomer closes the oldest connection that
// has sent nothing; with every open one spoken, the newcomer is refused.
// A connection that has spoken is never closed for another, and both
// closings are counted.
func TestGRPCConnectionsAtTheCap(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	closed := map[string]int{}
	g := newConnGuard(2, 2, func(reason string) { mu.Lock(); closed[reason]++; mu.Unlock() })
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(guardGRPCConns(lis, g, grpcKeepaliveTimeout)) }()
	t.Cleanup(srv.Stop)
	addr := lis.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	check := func(what string) *grpc.ClientConn {
		t.Helper()
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return conn
	}
	// The listener accepts in arrival order: the silent connection is
	// open before the first caller's, which has spoken when its call
	// returns.
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	first := check("the first caller, under the cap")
	second := check("a caller at the cap, a silent connection open")
	if !closedByServer(t, silent) {
		t.Error("the silent connection is still open; want it closed for the caller at the cap")
	}
	refused, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer refused.Close()
	if !closedByServer(t, refused) {
		t.Error("a newcomer with two callers' connections open was kept; want it refused")
	}
	for _, c := range []*grpc.ClientConn{first, second} {
		if _, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Errorf("a caller's connection after the newcomers: %v; want it served", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if closed[reasonQuiet] != 1 || closed[reasonFull] != 1 {
		t.Errorf("closed %v, want quiet 1 and full 1", closed)
	}
}

// closedByServer reports whether the server closed c: reading what it
// sent (gRPC's settings) ends in EOF or a reset, not in the deadline.
func closedByServer(t *testing.T, c net.Conn) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, c)
	return !errors.Is(err, os.ErrDeadlineExceeded)
}
