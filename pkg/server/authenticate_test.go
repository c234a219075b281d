package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"kurz.dev/pkg/server"
	"kurz.dev/pkg/testkit/servertest"
)

// A call GRPCAuthenticate refuses is answered with its refusal when its
// headers arrive, while its request is still unsent, and counted in
// kurz_grpc_calls_refused_total (reason unauthenticated); it takes no place
// at the gate, and a call it admits is served.
func TestGRPCCallsRefusedByAuthenticateBeforeTheirRequestArrives(t *testing.T) {
	const max = 16
	authenticate := func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if v := info.Header["x-test-key"]; len(v) != 1 || v[0] != "open sesame" {
			return nil, status.Error(codes.Unauthenticated, "no key")
		}
		return ctx, nil
	}
	r := startWith(t, server.Config{GRPCMaxCalls: max, GRPCAuthenticate: authenticate}, nil)
	for range max + 1 { // more than the gate holds: none takes a place
		got, err := servertest.StallGRPCCall(r.Server.GRPCAddr(), "/grpc.health.v1.Health/Check", server.DefaultGRPCMaxRecvMsgSize-64, 32<<10, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != int(codes.Unauthenticated) || got.Message != "no key" {
			t.Fatalf("call without the key: grpc-status %d (%q) after %d bytes of its request, want %d (Unauthenticated) \"no key\"", got.Status, got.Message, got.Sent, codes.Unauthenticated)
		}
	}
	if got := metricValue(t, r.HTTP+"/metrics", "kurz_grpc_calls_refused_total"); got != max+1 {
		t.Errorf("kurz_grpc_calls_refused_total %v after %d refusals, want %d", got, max+1, max+1)
	}
	body := metricsPage(t, r.HTTP+"/metrics")
	if !servertest.HasSeries(body, "kurz_grpc_calls_refused_total", `reason="unauthenticated"`) || servertest.HasSeries(body, "kurz_grpc_calls_refused_total", `reason="busy"`) {
		t.Errorf("refusals without the key not counted as reason=\"unauthenticated\" alone:\n%s", body)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-test-key", "open sesame")
	if _, err := healthpb.NewHealthClient(r.Conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health check with the key: %v", err)
	}
}
