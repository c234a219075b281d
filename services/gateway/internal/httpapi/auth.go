package httpapi

import (
	"cmp"
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

	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/guessgate"
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

// bareKey returns the token of a single Authorization field that is the
// key alone, without a scheme: what Bitly takes as well as "Bearer
// <token>", and what its Node SDK (bitly) sends. Only the Bitly API takes
// it (route.bitly).
func bareKey(values []string) (string, bool) {
	if len(values) != 1 {
		return "", false
	}
	token := strings.TrimSpace(values[0])
	return token, token != "" && !strings.ContainsAny(token, " \t")
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
// rule, so a blocked address gets 429 even with a valid key. bare takes
// the key without "Bearer " too (bareKey), on Bitly's routes.
func (a *API) authenticate(c *call, anonymousOK, bare bool) error {
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
	token, ok := bearer(values)
	if !ok && bare {
		token, ok = bareKey(values)
	}
	return a.authenticateKey(c, token, ok, `the Authorization header must be one "Bearer <key>"`)
}

// authenticateKey resolves the tenant of an API key a request carries
// (token; ok false when the credential is malformed, refused with
// malformed): first the brute-force rule on the client IP, then the key
// store. Every way a request sends a key (Authorization, the YOURLS API's
// signature, the Shlink API's X-Api-Key) goes through here, so all count
// failures and answer alike.
func (a *API) authenticateKey(c *call, token string, ok bool, malformed string) error {
	check, err := a.checkAuthFailures(c)
	if err != nil {
		return err
	}
	defer check.Done()
	if !ok {
		return a.authFailed(c, check, "malformed", "", malformed)
	}
	p, err := a.keys.Authenticate(c.r.Context(), token)
	if errors.Is(err, keystore.ErrInvalidKey) {
		id, _ := keystore.ParseKeyID(token)
		return a.authFailed(c, check, "invalid_key", id, "the API key is invalid or revoked")
	}
	if errors.Is(err, keystore.ErrTenantSuspended) {
		// The key is right: no failure counts against the address. The
		// refusal still spends the tenant's quota, as its requests did
		// before: a runaway integration, one reason to suspend, must not
		// gain unlimited requests (each a key look-up and a log line) by
		// being suspended.
		c.keyID = p.KeyID
		c.st.setTenant(p.Tenant)
		if err := a.edgeQuota(c, cmp.Or(c.charge, c.st.route)); err != nil {
			return err
		}
		a.log.InfoContext(c.r.Context(), "request of a suspended tenant refused", "key_id", p.KeyID,
			"route", c.st.route, "request_id", c.st.id)
		return tenantSuspended()
	}
	if err != nil {
		return unavailable("authentication is temporarily unavailable; try again", err)
	}
	c.keyID, c.key = p.KeyID, token
	c.st.setTenant(p.Tenant)
	return nil
}

// keyRevoked reports whether the API key a call was admitted with is no
// longer valid (revoked, gone with its tenant, or its tenant suspended),
// for a response that outlives its admission: an export asks before each
// page. See readmit.
func (a *API) keyRevoked(c *call) bool { return a.readmit(c) != nil }

// readmit checks again the API key a call was admitted with, for work
// that outlives its admission (an export's later pages, a bulk body
// uploaded slowly, an import's batches), and returns the refusal the call
// would get now: 403 TENANT_SUSPENDED for a tenant suspended meanwhile,
// 401 for a key revoked or gone. It costs one key look-up (the one
// authenticate made, a primary-key read), next to a page or a batch of up
// to a thousand links. When the key store cannot answer, the key is taken
// as still valid: a store outage is not a revocation, and the next check
// asks again. An anonymous call has no key to lose.
func (a *API) readmit(c *call) error {
	if c.keyID == "" {
		return nil
	}
	p, err := a.keys.Authenticate(c.r.Context(), c.key)
	switch {
	case errors.Is(err, keystore.ErrTenantSuspended):
		return tenantSuspended()
	case errors.Is(err, keystore.ErrInvalidKey):
		return unauthenticated("the API key was revoked while the request was in progress", "invalid_token")
	case err != nil:
		a.log.WarnContext(c.r.Context(), "could not check the API key again; going on", "route", c.st.route,
			"request_id", c.st.id, "key_id", c.keyID, "err", err)
		return nil
	case p.KeyID != c.keyID || p.Tenant != c.tenant():
		return unauthenticated("the API key was revoked while the request was in progress", "invalid_token")
	}
	return nil
}

// reasonTenantSuspended is the ErrorInfo reason of a suspended tenant's
// refused request.
const reasonTenantSuspended = "TENANT_SUSPENDED"

// tenantSuspended refuses a valid key of a suspended tenant: 403, not 401,
// so that a client does not take its key for a wrong one and rotate it.
// The administrator's reason is never in it: it is an operator's note
// (an investigation, a report's source) and the tenant may be the abuser.
func tenantSuspended() *apiError {
	e := newError(http.StatusForbidden, codeName(codes.PermissionDenied),
		"this tenant is suspended: its API keys, links and webhooks are stopped; contact the operator of this service")
	e.reason = reasonTenantSuspended
	return e
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
	defer check.Done()
	token, ok := bearer(values)
	sum := sha256.Sum256([]byte(token))
	if !ok || subtle.ConstantTimeCompare(sum[:], a.adminHash[:]) != 1 {
		return a.authFailed(c, check, "admin_token", "", "the admin token is invalid")
	}
	return nil
}

// checkAuthFailures looks (cost 0) at the auth rule for the client IP and
// refuses the call when the IP has used up its failures; otherwise the
// returned ticket admits the credential check (pkg/guessgate): end it with
// Fail (authFailed does) or Done once the check is over. When the limiter
// cannot tell, the rule fails closed only for IPs this gateway saw failing
// within the rule's window: a Redis or limiter outage must not lock every
// user out, only the addresses already guessing.
func (a *API) checkAuthFailures(c *call) (*guessgate.Ticket, error) {
	ctx, ip := c.r.Context(), c.st.ipKey
	var d quota.Decision
	t, err := a.authChecks.Admit(ctx, ip, func() (int64, error) {
		d = a.quota.Peek(ctx, DomainAuth, map[string]string{"ip": ip}, quota.FailClosed)
		switch {
		case d.Abandoned:
			return 0, ctx.Err()
		case d.Unchecked():
			a.m.degraded.Add(ctx, 1, metric.WithAttributes(attribute.String("domain", DomainAuth)))
			if _, seen := a.failures.recent(ip); seen {
				return 0, tooManyAuthFailures(d)
			}
			// Nothing says how many failures are left: the address's
			// checks run one at a time, so its first failure blocks the
			// rest (a burst of guesses all checked at once otherwise).
			return 1, nil
		}
		a.failures.setTTL(d.Window)
		switch {
		case d.Rule == "":
			return guessgate.Unlimited, nil
		case d.Allowed && d.Remaining > 0:
			return d.Remaining, nil
		}
		// Remember the block here too: the failures may have been
		// counted by another replica, and this one must keep the IP out
		// if Redis fails.
		a.failures.add(ip)
		c.setRateLimit(DomainAuth, d)
		return 0, denied(DomainAuth, d, "too many failed authentications from this address")
	})
	if errors.Is(err, guessgate.ErrSpent) {
		return nil, tooManyAuthFailures(d)
	}
	return t, err
}

// tooManyAuthFailures refuses an address whose failures this gateway
// counted and the limiter cannot see (d, the last look, did not count
// them).
func tooManyAuthFailures(d quota.Decision) error {
	e := newError(http.StatusTooManyRequests, "RESOURCE_EXHAUSTED",
		"too many failed authentications from this address; retry later")
	e.retryAfter, e.reason = max(d.RetryAfter, time.Second), rpcerr.ReasonRateLimited
	return e
}

// authFailed counts a failed authentication against the client IP (in the
// limiter and in the gateway's memory), logs it without the credential, and
// returns the 401; it ends t as a failure, which counts against the
// address's checks in flight here when the limiter did not count it.
func (a *API) authFailed(c *call, t *guessgate.Ticket, reason, keyID, msg string) error {
	ctx, key := c.r.Context(), c.st.ipKey
	a.failures.add(key)
	a.m.authFailures.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", reason)))
	// Counted even if the client hangs up meanwhile: one that half-closes
	// still reads its 401, and must not guess for free.
	d := a.quota.Check(context.WithoutCancel(ctx), DomainAuth, map[string]string{"ip": key}, 1, quota.FailClosed)
	t.Fail(!d.Unchecked())
	if d.Unchecked() {
		a.m.degraded.Add(ctx, 1, metric.WithAttributes(attribute.String("domain", DomainAuth)))
	} else {
		a.failures.setTTL(d.Window)
		c.setRateLimit(DomainAuth, d)
	}
	a.log.InfoContext(ctx, "authentication failed", "reason", reason, "key_id", keyID, "ip", c.st.ip,
		"route", c.st.route, "request_id", c.st.id, "failures_left", d.Remaining, "limiter_blind", d.Unchecked())
	bearerErr := "invalid_token"
	if reason == "malformed" {
		bearerErr = "invalid_request"
	}
	return unauthenticated(msg, bearerErr)
}
