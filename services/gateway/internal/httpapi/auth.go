package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/services/gateway/internal/keystore"
)

func unauthenticated(msg, bearerError string) *apiError {
	e := newError(http.StatusUnauthorized, "UNAUTHENTICATED", msg)
	challenge := `Bearer realm="kurz"`
	if bearerError != "" {
		challenge += `, error="` + bearerError + `"`
	}
	e.header = http.Header{"Www-Authenticate": {challenge}}
	return e
}

// bearer returns the token of a single "Authorization: Bearer <token>".
func bearer(values []string) (string, bool) {
	if len(values) != 1 {
		return "", false
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(values[0]), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" || strings.ContainsAny(token, " \t") {
		return "", false
	}
	return token, true
}

// crossSite reports whether a browser sent r from another site's page: a
// form or a no-cors fetch there is a simple request, sent without asking,
// so without it any page could have its visitors' browsers create
// anonymous links (with an alias it picks) from their addresses, spreading
// the per-IP bound over them. Browsers say so in Sec-Fetch-Site, and in
// an Origin that is not the gateway's own (or "null"); clients that are
// not browsers send neither.
func crossSite(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" {
		return s == "cross-site"
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return false
	}
	u, err := url.Parse(o)
	return err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host)
}

// authenticate resolves the tenant a call acts for: from its API key, or
// "anonymous" on routes that allow it when the request carries no key. A
// request carrying credentials is first checked against the brute-force
// rule, so a blocked address gets 429 even with a valid key.
func (a *API) authenticate(c *call, anonymousOK bool) error {
	values := c.r.Header.Values("Authorization")
	if len(values) == 0 {
		if anonymousOK && a.opts.AllowAnonymous {
			if crossSite(c.r) {
				return newError(http.StatusForbidden, codeName(codes.PermissionDenied),
					"anonymous link creation is refused from another site's page: send an API key")
			}
			c.st.setTenant(callmeta.AnonymousTenant)
			return nil
		}
		return unauthenticated("an API key is required: send Authorization: Bearer <key>", "")
	}
	check, err := a.checkAuthFailures(c)
	if err != nil {
		return err
	}
	failed := false
	defer func() { check.done(failed) }()
	token, ok := bearer(values)
	if !ok {
		failed = true
		return a.authFailed(c, check, "malformed", "", `the Authorization header must be one "Bearer <key>"`)
	}
	p, err := a.keys.Authenticate(c.r.Context(), token)
	if errors.Is(err, keystore.ErrInvalidKey) {
		id, _ := keystore.ParseKeyID(token)
		failed = true
		return a.authFailed(c, check, "invalid_key", id, "the API key is invalid or revoked")
	}
	if err != nil {
		return unavailable("authentication is temporarily unavailable; try again", err)
	}
	c.keyID = p.KeyID
	c.st.setTenant(p.Tenant)
	return nil
}

// authenticateAdmin checks the admin token in constant time (of equal-length
// digests). Failures count against the client IP like bad API keys.
func (a *API) authenticateAdmin(c *call) error {
	values := c.r.Header.Values("Authorization")
	if len(values) == 0 {
		return unauthenticated("the admin API needs Authorization: Bearer <admin token>", "")
	}
	check, err := a.checkAuthFailures(c)
	if err != nil {
		return err
	}
	failed := false
	defer func() { check.done(failed) }()
	token, ok := bearer(values)
	sum := sha256.Sum256([]byte(token))
	if !ok || subtle.ConstantTimeCompare(sum[:], a.adminHash[:]) != 1 {
		failed = true
		return a.authFailed(c, check, "admin_token", "", "the admin token is invalid")
	}
	return nil
}

// limiterBlind reports whether a decision of the auth rule says nothing
// about the IP: the limiter did not answer, or Redis did not and the rule
// failed closed for everyone.
func limiterBlind(d quota.Decision) bool {
	return d.Degraded || d.Source == ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED
}

// checkAuthFailures looks (cost 0) at the auth rule for the client IP and
// refuses the call when the IP has used up its failures; otherwise the
// returned ticket admits the credential check (see authSlots), and its
// done must be called once the check is over, with whether it failed
// (and was charged). When the limiter cannot tell, the rule fails closed
// only for IPs this gateway saw failing within the rule's window: a Redis
// or limiter outage must not lock every user out, only the addresses
// already guessing.
func (a *API) checkAuthFailures(c *call) (*authTicket, error) {
	ctx, ip := c.r.Context(), c.st.ipKey
	t := a.authSlots.begin(ip)
	for {
		t.look()
		var rec windowRecord
		d := a.quota.Peek(withWindow(ctx, &rec), DomainAuth, map[string]string{"ip": ip}, quota.FailClosed)
		if d.Abandoned {
			t.done(false)
			return nil, ctx.Err()
		}
		blind := limiterBlind(d)
		if !blind {
			a.failures.setTTL(rec.window)
		}
		var left int64
		switch {
		case blind:
			a.m.degraded.Add(ctx, 1, metric.WithAttributes(attribute.String("domain", DomainAuth)))
			if _, seen := a.failures.recent(ip); seen {
				t.done(false)
				e := newError(http.StatusTooManyRequests, "RESOURCE_EXHAUSTED",
					"too many failed authentications from this address; retry later")
				e.retryAfter, e.reason = max(d.RetryAfter, time.Second), rpcerr.ReasonRateLimited
				return nil, e
			}
			// Nothing says how many failures are left: the address's
			// checks run one at a time, so its first failure blocks the
			// rest (a burst of guesses all checked at once otherwise).
			left = 1
		case d.Rule == "":
			return t, nil
		case d.Allowed && d.Remaining > 0:
			left = d.Remaining
		default:
			t.done(false)
			// Remember the block here too: the failures may have been
			// counted by another replica, and this one must keep the IP
			// out if Redis fails.
			a.failures.add(ip)
			setRateLimitHeaders(c.w.Header(), DomainAuth, d, rec.window)
			return nil, denied(DomainAuth, d, "too many failed authentications from this address")
		}
		admitted, err := t.await(ctx, left)
		if errors.Is(err, errFailuresSpent) {
			t.done(false)
			e := newError(http.StatusTooManyRequests, "RESOURCE_EXHAUSTED",
				"too many failed authentications from this address; retry later")
			e.retryAfter, e.reason = max(d.RetryAfter, time.Second), rpcerr.ReasonRateLimited
			return nil, e
		}
		if err != nil {
			t.done(false)
			return nil, err
		}
		if admitted {
			return t, nil
		}
		// A check of the address failed since the look: look again.
	}
}

// authFailed counts a failed authentication against the client IP (in the
// limiter and in the gateway's memory), logs it without the credential, and
// returns the 401. A charge the limiter did not take (it timed out) is
// kept against the address by t (authSlots).
func (a *API) authFailed(c *call, t *authTicket, reason, keyID, msg string) error {
	ctx, key := c.r.Context(), c.st.ipKey
	a.failures.add(key)
	a.m.authFailures.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", reason)))
	var rec windowRecord
	// Counted even if the client hangs up meanwhile: one that half-closes
	// still reads its 401, and must not guess for free.
	d := a.quota.Check(withWindow(context.WithoutCancel(ctx), &rec), DomainAuth, map[string]string{"ip": key}, 1, quota.FailClosed)
	if limiterBlind(d) {
		a.m.degraded.Add(ctx, 1, metric.WithAttributes(attribute.String("domain", DomainAuth)))
	} else {
		a.failures.setTTL(rec.window)
		setRateLimitHeaders(c.w.Header(), DomainAuth, d, rec.window)
	}
	a.log.InfoContext(ctx, "authentication failed", "reason", reason, "key_id", keyID, "ip", c.st.ip,
		"route", c.st.route, "request_id", c.st.id, "failures_left", d.Remaining, "limiter_blind", limiterBlind(d))
	bearerErr := "invalid_token"
	if reason == "malformed" {
		bearerErr = "invalid_request"
	}
	return unauthenticated(msg, bearerErr)
}
