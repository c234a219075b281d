package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/grpc"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
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

// RecordWindows wraps the limiter connection given to quota.New so that a
// CheckQuota made with a context from withWindow learns the deciding rule's
// window, which quota.Decision does not carry and RateLimit-Policy needs.
func RecordWindows(conn grpc.ClientConnInterface) grpc.ClientConnInterface {
	return windowConn{conn}
}

type windowConn struct{ grpc.ClientConnInterface }

type windowKey struct{}

// windowRecord receives the deciding rule's window of one call.
type windowRecord struct{ window time.Duration }

func withWindow(ctx context.Context, rec *windowRecord) context.Context {
	return context.WithValue(ctx, windowKey{}, rec)
}

func (c windowConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	err := c.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
	rec, ok := ctx.Value(windowKey{}).(*windowRecord)
	resp, isQuota := reply.(*ratelimitv1.CheckQuotaResponse)
	if err != nil || !ok || !isQuota {
		return err
	}
	for _, d := range resp.GetDecisions() {
		if d.GetRule() == resp.GetDecidingRule() {
			rec.window = d.GetWindow().AsDuration()
			break
		}
	}
	return err
}

// rateLimitFields are the RateLimit-Policy and RateLimit field values of
// one decision (quota.Decision.Fields), with the window withWindow
// recorded. ok is false when no rule limited.
func rateLimitFields(domain string, d quota.Decision, window time.Duration) (policy, state string, ok bool) {
	d.Window = window
	q, ok := d.Fields(domain)
	if !ok {
		return "", "", false
	}
	policy, state = ratelimitfields.Fields(q)
	return policy, state, true
}

// setRateLimitHeaders writes the fields of d, if any.
func setRateLimitHeaders(h http.Header, domain string, d quota.Decision, window time.Duration) {
	if policy, state, ok := rateLimitFields(domain, d, window); ok {
		h[ratelimitfields.PolicyField] = []string{policy}
		h[ratelimitfields.StateField] = []string{state}
	}
}

// denied is the 429 of a limiter denial: the deciding policy and when to
// come back, at least a second from now, as a service's 429 says it
// (Retry-After counts whole seconds; retryAfterMs must not say less), with
// the reason a service's quota refusal gives.
func denied(domain string, d quota.Decision, what string) *apiError {
	retry := d.RetryAfter
	if retry <= 0 {
		retry = d.ResetAfter
	}
	retry = max(retry, time.Second)
	e := newError(http.StatusTooManyRequests, "RESOURCE_EXHAUSTED",
		fmt.Sprintf("%s (policy %s/%s); retry after %ds", what, domain, d.Rule, ceilSeconds(retry)))
	e.retryAfter, e.ownQuota, e.reason = retry, true, rpcerr.ReasonRateLimited
	return e
}
