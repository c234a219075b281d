package app

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/services/limiter/internal/ratelimit"
)

// Bounds on a request, checked before anything touches Redis.
const (
	maxDescriptors     = 32
	maxDescriptorKey   = 64
	maxDescriptorValue = 1024
	maxCost            = 1_000_000
	// maxBatch bounds the checks of one CheckQuotas call.
	maxBatch = 1000
	// batchParallelism is how many checks of one CheckQuotas call are in
	// flight at once: enough to fill the engine's Redis pipelines.
	batchParallelism = 64
)

// quotaService serves kurz.ratelimit.v1.RateLimitService.
type quotaService struct {
	ratelimitv1.UnimplementedRateLimitServiceServer
	engine *ratelimit.Engine
}

// CheckQuota implements ratelimitv1.RateLimitServiceServer.
func (q *quotaService) CheckQuota(ctx context.Context, req *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error) {
	cost, err := validate(q.engine.Rules(), req.GetDomain(), req.GetDescriptors(), req.Cost)
	if err != nil {
		return nil, err
	}
	return q.engine.Check(ctx, req.GetDomain(), req.GetDescriptors(), cost), nil
}

// CheckQuotas implements ratelimitv1.RateLimitServiceServer: every check is
// validated before any is decided, then they are decided concurrently, each
// exactly as by CheckQuota.
func (q *quotaService) CheckQuotas(ctx context.Context, req *ratelimitv1.CheckQuotasRequest) (*ratelimitv1.CheckQuotasResponse, error) {
	checks := req.GetChecks()
	if len(checks) > maxBatch {
		return nil, status.Errorf(codes.InvalidArgument, "%d checks: at most %d per call", len(checks), maxBatch)
	}
	rules := q.engine.Rules()
	costs := make([]int64, len(checks))
	for i, c := range checks {
		cost, err := validate(rules, c.GetDomain(), c.GetDescriptors(), c.Cost)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "checks[%d]: %s", i, status.Convert(err).Message())
		}
		costs[i] = cost
	}
	results := make([]*ratelimitv1.CheckQuotaResponse, len(checks))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(batchParallelism, len(checks)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(checks) {
					return
				}
				results[i] = q.engine.Check(ctx, checks[i].GetDomain(), checks[i].GetDescriptors(), costs[i])
			}
		})
	}
	wg.Wait()
	return &ratelimitv1.CheckQuotasResponse{Results: results}, nil
}

// ExplainQuota implements ratelimitv1.RateLimitServiceServer.
func (q *quotaService) ExplainQuota(ctx context.Context, req *ratelimitv1.ExplainQuotaRequest) (*ratelimitv1.ExplainQuotaResponse, error) {
	cost, err := validate(q.engine.Rules(), req.GetDomain(), req.GetDescriptors(), req.Cost)
	if err != nil {
		return nil, err
	}
	resp, err := q.engine.Explain(ctx, req.GetDomain(), req.GetDescriptors(), cost)
	if err != nil {
		return nil, status.Error(codes.Unavailable, "rate-limit state is unreachable right now; retry shortly")
	}
	return resp, nil
}

// validate checks a request at the boundary and returns its cost (1 when
// unset).
func validate(rules *ratelimit.Ruleset, domain string, desc map[string]string, cost *uint32) (int64, error) {
	if domain == "" {
		return 0, status.Error(codes.InvalidArgument, "domain is required (e.g. \"api\", \"links.create\")")
	}
	if !rules.HasDomain(domain) {
		return 0, status.Errorf(codes.InvalidArgument, "unknown domain %q; configured domains: %v", domain, rules.Domains())
	}
	if len(desc) > maxDescriptors {
		return 0, status.Errorf(codes.InvalidArgument, "%d descriptors: at most %d", len(desc), maxDescriptors)
	}
	for k, v := range desc {
		if k == "" || len(k) > maxDescriptorKey {
			return 0, status.Errorf(codes.InvalidArgument, "descriptor name %q: want 1 to %d bytes", truncate(k), maxDescriptorKey)
		}
		if len(v) > maxDescriptorValue {
			return 0, status.Errorf(codes.InvalidArgument, "descriptor %q: value of %d bytes, at most %d", k, len(v), maxDescriptorValue)
		}
	}
	if cost == nil {
		return 1, nil
	}
	if *cost > maxCost {
		return 0, status.Errorf(codes.InvalidArgument, "cost %d: at most %d", *cost, maxCost)
	}
	return int64(*cost), nil
}

func truncate(s string) string {
	if len(s) > 32 {
		return fmt.Sprintf("%s...", s[:32])
	}
	return s
}
