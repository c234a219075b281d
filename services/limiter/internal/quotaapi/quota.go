// Package quotaapi serves the limiter's gRPC APIs over the rate-limit
// engine: kurz.ratelimit.v1.RateLimitService (CheckQuota, CheckQuotas,
// ExplainQuota) and Envoy's envoy.service.ratelimit.v3.RateLimitService
// (ShouldRateLimit). Requests are bounded and validated here, before
// anything touches Redis; refusals are INVALID_ARGUMENT with kurz's
// ErrorInfo (rpcerr).
package quotaapi

import (
	"context"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/pkg/textcut"
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
)

// Engine is what the handlers need of *ratelimit.Engine: the rules, and
// the decisions.
type Engine interface {
	Rules() *ratelimit.Ruleset
	Check(ctx context.Context, domain string, desc map[string]string, cost int64) *ratelimitv1.CheckQuotaResponse
	CheckMany(ctx context.Context, reqs []ratelimit.Request) []*ratelimitv1.CheckQuotaResponse
	CheckEach(ctx context.Context, domain string, descs []map[string]string, costs []int64) (*ratelimitv1.CheckQuotaResponse, [][]int)
	Explain(ctx context.Context, domain string, desc map[string]string, cost int64) (*ratelimitv1.ExplainQuotaResponse, error)
}

// Service serves kurz.ratelimit.v1.RateLimitService.
type Service struct {
	ratelimitv1.UnimplementedRateLimitServiceServer
	engine Engine
}

// New returns the service over engine.
func New(engine Engine) *Service { return &Service{engine: engine} }

// CheckQuota implements ratelimitv1.RateLimitServiceServer.
func (q *Service) CheckQuota(ctx context.Context, req *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error) {
	cost, inv := validate(q.engine.Rules(), req.GetDomain(), req.GetDescriptors(), req.Cost)
	if inv != nil {
		return nil, inv.Status()
	}
	return q.engine.Check(ctx, req.GetDomain(), req.GetDescriptors(), cost), nil
}

// CheckQuotas implements ratelimitv1.RateLimitServiceServer: every check is
// validated before any is decided, then they are decided together, each
// exactly as by CheckQuota (Engine.CheckMany).
func (q *Service) CheckQuotas(ctx context.Context, req *ratelimitv1.CheckQuotasRequest) (*ratelimitv1.CheckQuotasResponse, error) {
	checks := req.GetChecks()
	if len(checks) > maxBatch {
		return nil, rpcerr.Invalidf("checks", ReasonBatchSizeInvalid, "%d checks: at most %d per call", len(checks), maxBatch).Status()
	}
	rules := q.engine.Rules()
	reqs := make([]ratelimit.Request, len(checks))
	for i, c := range checks {
		cost, inv := validate(rules, c.GetDomain(), c.GetDescriptors(), c.Cost)
		if inv != nil {
			return nil, inCheck(inv, i).Status()
		}
		reqs[i] = ratelimit.Request{Domain: c.GetDomain(), Desc: c.GetDescriptors(), Cost: cost}
	}
	results := q.engine.CheckMany(ctx, reqs)
	return &ratelimitv1.CheckQuotasResponse{Results: results}, nil
}

// ExplainQuota implements ratelimitv1.RateLimitServiceServer.
func (q *Service) ExplainQuota(ctx context.Context, req *ratelimitv1.ExplainQuotaRequest) (*ratelimitv1.ExplainQuotaResponse, error) {
	cost, inv := validate(q.engine.Rules(), req.GetDomain(), req.GetDescriptors(), req.Cost)
	if inv != nil {
		return nil, inv.Status()
	}
	// Explain fails only on Redis: the state it reads is not there to read.
	resp, err := q.engine.Explain(ctx, req.GetDomain(), req.GetDescriptors(), cost)
	if err != nil {
		return nil, stateUnavailable()
	}
	return resp, nil
}

// validate checks a request at the boundary and returns its cost (1 when
// unset), or why it is refused.
func validate(rules *ratelimit.Ruleset, domain string, desc map[string]string, cost *uint32) (int64, *rpcerr.Invalid) {
	if domain == "" {
		return 0, rpcerr.Invalidf("domain", ReasonDomainRequired, "domain is required (e.g. \"api\", \"links.create\")")
	}
	if !rules.HasDomain(domain) {
		return 0, rpcerr.Invalidf("domain", ReasonDomainUnknown, "unknown domain %q; configured domains: %v", domain, rules.Domains())
	}
	return validateDescriptors(desc, cost, true)
}

// validateDescriptors bounds a request's descriptors (their values too if
// boundValues) and cost.
func validateDescriptors(desc map[string]string, cost *uint32, boundValues bool) (int64, *rpcerr.Invalid) {
	if len(desc) > maxDescriptors {
		return 0, rpcerr.Invalidf("descriptors", ReasonDescriptorsInvalid, "%d descriptors: at most %d", len(desc), maxDescriptors)
	}
	for k, v := range desc {
		if k == "" || len(k) > maxDescriptorKey {
			return 0, rpcerr.Invalidf("descriptors", ReasonDescriptorsInvalid, "descriptor name %q: want 1 to %d bytes", textcut.Echo(k, maxEchoedName), maxDescriptorKey)
		}
		if boundValues && len(v) > maxDescriptorValue {
			return 0, rpcerr.Invalidf("descriptors", ReasonDescriptorsInvalid, "descriptor %q: value of %d bytes, at most %d", k, len(v), maxDescriptorValue)
		}
	}
	if cost == nil {
		return 1, nil
	}
	if *cost > maxCost {
		return 0, rpcerr.Invalidf("cost", ReasonCostInvalid, "cost %d: at most %d", *cost, maxCost)
	}
	return int64(*cost), nil
}

// maxEchoedName bounds the part of a refused descriptor name an error
// repeats: the name can be as large as the request.
const maxEchoedName = 32
