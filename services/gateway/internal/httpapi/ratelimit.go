package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/quota"
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

// rateLimitFields are the IETF RateLimit-Policy and RateLimit field values
// (draft-ietf-httpapi-ratelimit-headers, structured fields) of one decision:
// the deciding rule as the policy, q = its limit per w seconds, r = what is
// left, t = seconds until it is back to full. ok is false when no rule
// decided (no rule matched, or the limiter did not answer).
func rateLimitFields(domain string, d quota.Decision, window time.Duration) (policy, state string, ok bool) {
	if d.Degraded || d.Rule == "" || d.Source == ratelimitv1.DecisionSource_DECISION_SOURCE_NO_RULE {
		return "", "", false
	}
	name := sfString(domain + "/" + d.Rule)
	policy = name + ";q=" + strconv.FormatInt(max(d.Limit, 0), 10)
	if w := ceilSeconds(window); w > 0 {
		policy += ";w=" + strconv.FormatInt(w, 10)
	}
	remaining, reset := max(d.Remaining, 0), ceilSeconds(d.ResetAfter)
	if !d.Allowed {
		remaining, reset = 0, max(reset, ceilSeconds(d.RetryAfter))
	}
	state = fmt.Sprintf("%s;r=%d;t=%d", name, remaining, reset)
	return policy, state, true
}

// setRateLimitHeaders writes the fields of d, if any, spelt as the draft
// spells them (field names are case-insensitive; Go would send
// "Ratelimit-Policy").
func setRateLimitHeaders(h http.Header, domain string, d quota.Decision, window time.Duration) {
	if policy, state, ok := rateLimitFields(domain, d, window); ok {
		h["RateLimit-Policy"] = []string{policy}
		h["RateLimit"] = []string{state}
	}
}

// sfString writes s as a structured-field String (RFC 9651 §3.3.3).
func sfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := range len(s) {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?') // not representable; rule names never hold these
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// denied is the 429 of a limiter denial: the deciding policy and when to
// come back.
func denied(domain string, d quota.Decision, what string) *apiError {
	retry := d.RetryAfter
	if retry <= 0 {
		retry = max(d.ResetAfter, time.Second)
	}
	e := newError(http.StatusTooManyRequests, "RESOURCE_EXHAUSTED",
		fmt.Sprintf("%s (policy %s/%s); retry after %ds", what, domain, d.Rule, ceilSeconds(retry)))
	e.retryAfter = retry
	return e
}
