package server_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"kurz.dev/pkg/server"
	"kurz.dev/pkg/testkit/servertest"
)

// A kurz gRPC server sends no flow-control pings: with gRPC's dynamic
// windows it pings its client after each request that arrives alone, to
// estimate the bandwidth (a write and a read more per call at low load).
// The client here keeps gRPC's defaults, as Envoy's or any caller's would.
func TestGRPCServerSendsNoBandwidthPings(t *testing.T) {
	r := start(t, server.HTTPLimits{})
	var pings atomic.Int64
	conn, err := grpc.NewClient(r.Server.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			return servertest.CountPings(c, true, &pings), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for range 50 {
		if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if n := pings.Load(); n != 0 {
		t.Errorf("50 calls one at a time: the server sent %d pings, want none", n)
	}
}
