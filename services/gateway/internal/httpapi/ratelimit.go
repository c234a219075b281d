package httpapi

import (
	"fmt"
	"net/http"

	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/ratelimitfields"
	"kurz.dev/pkg/rpcerr"
)

// Limiter domains the gateway asks about.
const (
	// DomainAPI holds the edge quotas: descriptors tenant, api_key (the
	// key's ID), ip and route (the mux pattern, e.g. "POST /v1/links").
	DomainAPI = "api"
	// DomainAuth holds the brute-force rule on failed authentications:
	// descriptor ip.
	DomainAuth = "auth"
)

// rateLimitFields are the RateLimit-Policy and RateLimit field values of
// one decision (quota.Decision.Fields). ok is false when no rule limited.
func rateLimitFields(domain string, d quota.Decision) (policy, state string, ok bool) {
	q, ok := d.Fields(domain)
	if !ok {
		return "", "", false
	}
	policy, state = ratelimitfields.Fields(q)
	return policy, state, true
}

// setRateLimitHeaders writes the fields of d, if any, and reports whether
// it had some.
func setRateLimitHeaders(h http.Header, domain string, d quota.Decision) bool {
	policy, state, ok := rateLimitFields(domain, d)
	if ok {
		h[ratelimitfields.PolicyField] = []string{policy}
		h[ratelimitfields.StateField] = []string{state}
	}
	return ok
}

// setRateLimit writes the RateLimit fields of d, a decision of domain on
// c, unless the answer already carries those of another rule that is
// stricter (quota.Decision.Stricter): a call charged to two rules (a
// Shlink list and its visitsSummary's stats charge) tells the client of
// the one with less room left, whichever was charged last. A rule charged
// again tells of its last decision.
func (c *call) setRateLimit(domain string, d quota.Decision) {
	if p := c.rateLimit; p.set && (p.domain != domain || p.d.Rule != d.Rule) && !d.Stricter(p.d) {
		return
	}
	if setRateLimitHeaders(c.w.Header(), domain, d) {
		c.rateLimit = ruleDecision{set: true, domain: domain, d: d}
	}
}

// ruleDecision is the decision whose RateLimit fields an answer carries
// (set once there is one).
type ruleDecision struct {
	set    bool
	domain string
	d      quota.Decision
}

// denied is the 429 of a limiter denial: the deciding policy and when to
// come back, at least a second from now, as a service's 429 says it
// (Retry-After counts whole seconds; retryAfterMs must not say less), with
// the reason a service's quota refusal gives.
func denied(domain string, d quota.Decision, what string) *apiError {
	retry := d.ComeBackAfter()
	e := newError(http.StatusTooManyRequests, "RESOURCE_EXHAUSTED",
		fmt.Sprintf("%s (policy %s/%s); retry after %ds", what, domain, d.Rule, ceilSeconds(retry)))
	e.retryAfter, e.ownQuota, e.reason = retry, true, rpcerr.ReasonRateLimited
	return e
}
