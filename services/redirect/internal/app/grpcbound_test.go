//go:build integration

package app

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"kurz.dev/pkg/server"
)

// The redirect's gRPC listener serves health and reflection alone: it
// reads requests of up to server.SmallGRPCMaxRecvMsgSize, so a call held
// at the call gate holds no more of a request arriving.
func TestGRPCRequestsAreSmall(t *testing.T) {
	r := start(t, nil, hooks{})
	health := healthpb.NewHealthClient(r.Conn)
	_, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: strings.Repeat("s", server.SmallGRPCMaxRecvMsgSize)})
	if got := status.Code(err); got != codes.ResourceExhausted {
		t.Errorf("a %d-byte health check: %v (%v), want ResourceExhausted", server.SmallGRPCMaxRecvMsgSize, got, err)
	}
	if _, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("a health check after it: %v", err)
	}
}
