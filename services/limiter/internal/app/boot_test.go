//go:build integration

package app

import (
	"context"
	"slices"
	"testing"

	"kurz.dev/pkg/testkit/servertest"
)

func TestBootsHealthyAgainstTheCluster(t *testing.T) {
	srv, err := New(context.Background(), load(t, nil), servertest.Logger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "kurz.ratelimit.v1.RateLimitService")
	r.AssertOps(t, "redis")
	if got := r.GRPCServices(t); !slices.Contains(got, "kurz.ratelimit.v1.RateLimitService") {
		t.Errorf("reflection lists %v, want kurz.ratelimit.v1.RateLimitService", got)
	}
	if err := r.Stop(); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}
