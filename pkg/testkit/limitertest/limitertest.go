// Package limitertest is an in-process kurz.ratelimit.v1.RateLimitService for
// the tests of the limiter's callers: it records every CheckQuota (and each
// check of a CheckQuotas) and answers what the test decides. Tests of the
// limiter itself use the real one.
package limitertest

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

// Decider answers one CheckQuota.
type Decider func(*ratelimitv1.CheckQuotaRequest) *ratelimitv1.CheckQuotaResponse

// AllowAll allows every request, as if no rule matched.
func AllowAll(*ratelimitv1.CheckQuotaRequest) *ratelimitv1.CheckQuotaResponse {
	return &ratelimitv1.CheckQuotaResponse{Allowed: true, Source: ratelimitv1.DecisionSource_DECISION_SOURCE_NO_RULE}
}

// Deny denies every request under rule with the given retry-after.
func Deny(rule string, retryAfter time.Duration) Decider {
	return func(*ratelimitv1.CheckQuotaRequest) *ratelimitv1.CheckQuotaResponse {
		return &ratelimitv1.CheckQuotaResponse{
			Allowed: false, DecidingRule: rule, Limit: 10, Remaining: 0,
			RetryAfter: durationpb.New(retryAfter), ResetAfter: durationpb.New(retryAfter),
			Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS,
		}
	}
}

// Server is a running fake limiter.
type Server struct {
	ratelimitv1.UnimplementedRateLimitServiceServer
	addr   string
	mu     sync.Mutex
	decide Decider
	calls  []*ratelimitv1.CheckQuotaRequest
	// batches holds the size of each CheckQuotas call.
	batches []int
}

// Start serves a fake limiter (and a gRPC health service that reports
// SERVING) on a loopback port until the test ends. opts
// go to the gRPC server, e.g. an otelgrpc stats handler for a trace test.
func Start(t testing.TB, decide Decider, opts ...grpc.ServerOption) *Server {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("fake limiter: %v", err)
	}
	s := &Server{addr: lis.Addr().String(), decide: decide}
	g := grpc.NewServer(opts...)
	ratelimitv1.RegisterRateLimitServiceServer(g, s)
	// SERVING, so callers that gate their readiness on the limiter's
	// health (the gateway) become ready.
	healthpb.RegisterHealthServer(g, health.NewServer())
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return s
}

// Addr is the host:port to dial.
func (s *Server) Addr() string { return s.addr }

// SetDecider changes the answer of later calls.
func (s *Server) SetDecider(d Decider) {
	s.mu.Lock()
	s.decide = d
	s.mu.Unlock()
}

// Calls returns a copy of every request received so far.
func (s *Server) Calls() []*ratelimitv1.CheckQuotaRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*ratelimitv1.CheckQuotaRequest, len(s.calls))
	for i, c := range s.calls {
		out[i] = proto.Clone(c).(*ratelimitv1.CheckQuotaRequest)
	}
	return out
}

// CheckQuota records the request and answers with the current Decider.
func (s *Server) CheckQuota(_ context.Context, req *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error) {
	s.mu.Lock()
	s.calls = append(s.calls, proto.Clone(req).(*ratelimitv1.CheckQuotaRequest))
	d := s.decide
	s.mu.Unlock()
	return d(req), nil
}

// CheckQuotas answers each check as CheckQuota would, recording each as a
// call of its own.
func (s *Server) CheckQuotas(ctx context.Context, req *ratelimitv1.CheckQuotasRequest) (*ratelimitv1.CheckQuotasResponse, error) {
	s.mu.Lock()
	s.batches = append(s.batches, len(req.GetChecks()))
	s.mu.Unlock()
	resp := &ratelimitv1.CheckQuotasResponse{Results: make([]*ratelimitv1.CheckQuotaResponse, len(req.GetChecks()))}
	for i, c := range req.GetChecks() {
		resp.Results[i], _ = s.CheckQuota(ctx, c)
	}
	return resp, nil
}

// Batches returns the number of checks of each CheckQuotas call so far.
func (s *Server) Batches() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.batches)
}
