// Package httpapi is the gateway's public JSON API: the routes over the
// shortener and analytics services, API-key and admin authentication, the
// edge rate limits with their RateLimit headers, brute-force protection, and
// one mapping of errors to HTTP answers.
package httpapi

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	limiterv1 "kurz.dev/gen/kurz/limiter/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/capacity"
	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/guessgate"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/ratelimitfields"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/services/gateway/internal/keystore"
)

// failMemoryCapacity bounds the IPs remembered for failed authentications
// (about 100 bytes each).
const failMemoryCapacity = 100_000

// defaultFailTTL is how long a failure is remembered until the limiter has
// reported the auth rule's window (the bootstrap rule's 15 minutes).
const defaultFailTTL = 15 * time.Minute

// Options are the API's settings.
type Options struct {
	// MaxBodyBytes bounds a request body; larger ones are answered 413.
	MaxBodyBytes int64
	// MaxHeaderBytes bounds the request's header fields; larger ones are
	// answered 431.
	MaxHeaderBytes int
	// AllowAnonymous lets requests without a key create links as tenant
	// "anonymous" (POST /v1/links and POST /links).
	AllowAnonymous bool
	// AnonymousLocal is the bound on each anonymous client address while
	// the limiter does not answer in time (anonLocal); required with
	// AllowAnonymous.
	AnonymousLocal LocalRule
	// AdminToken guards /v1/admin/...; empty disables the admin API (404).
	AdminToken string
	// Clients finds each request's client (nil: the TCP peer).
	Clients *clientip.Policy
	// Keying turns the client's address into the key of its limits: an
	// IPv6 client's whole prefix is one client.
	Keying clientip.Keying
	// CallTimeout bounds each call to a service behind the gateway.
	CallTimeout time.Duration
	// MaxBulkRequests bounds the large bulk requests (POST /v1/links:batch
	// and /v1/links:import, up to 4 and 20 MB of body) the process serves
	// at once; past it they are answered 503 before their body is read.
	// One tenant holds at most half of them (at least one); past that its
	// next large bulk request is answered 429. A bulk request whose body is
	// declared within MaxBodyBytes takes none (admitBulk).
	MaxBulkRequests int
	// ReadTimeout is the HTTP listener's bound on reading a request: the
	// pacing of a bulk body (bulkBodyMinRate) never extends past it. Zero:
	// no such bound.
	ReadTimeout time.Duration
	// DefaultDomain is the host (with its port, if any) of the short URLs
	// on the default domain: the host of the shortener's base URL. Shlink's
	// GET /rest/v3/domains names the default domain by it, and Shlink's
	// clients send it back as a link's domain, which the shortener takes
	// as the default domain.
	DefaultDomain string
}

// KeyStore is what the API needs of the tenant and key store.
type KeyStore interface {
	Authenticate(ctx context.Context, key string) (keystore.Principal, error)
	CreateTenant(ctx context.Context, t keystore.Tenant) (keystore.Tenant, error)
	Tenant(ctx context.Context, id string) (keystore.Tenant, error)
	ListTenants(ctx context.Context, f keystore.TenantFilter, after string, size int) ([]keystore.Tenant, error)
	SetPlan(ctx context.Context, id, plan string) (keystore.Tenant, error)
	IssueKey(ctx context.Context, tenant, name string) (keystore.Key, string, error)
	Keys(ctx context.Context, tenant string) ([]keystore.Key, error)
	RevokeKey(ctx context.Context, tenant, id string) (keystore.Key, error)
	Suspend(ctx context.Context, id, reason string) (keystore.Tenant, error)
	Resume(ctx context.Context, id string) (keystore.Tenant, error)
}

// Deps are the API's collaborators.
type Deps struct {
	Shortener shortenerv1.ShortenerServiceClient
	// Webhooks is the shortener's WebhookService.
	Webhooks  shortenerv1.WebhookServiceClient
	Analytics analyticsv1.AnalyticsServiceClient
	// RulesAdmin is the limiter's RulesAdminService, its calls signed
	// (/v1/admin/rules).
	RulesAdmin limiterv1.RulesAdminServiceClient
	Quota      *quota.Client
	Keys       KeyStore
	Log        *slog.Logger
	Meter      metric.Meter
	// Ready reports whether the gateway is ready (its readiness checks'
	// last result), for Shlink's GET /rest/health; nil: always.
	Ready func() bool
}

// API serves the routes. Register them on a mux, then serve Wrap(mux).
type API struct {
	opts       Options
	shortener  shortenerv1.ShortenerServiceClient
	webhooks   shortenerv1.WebhookServiceClient
	analytics  analyticsv1.AnalyticsServiceClient
	rulesAdmin limiterv1.RulesAdminServiceClient
	quota      *quota.Client
	keys       KeyStore
	log        *slog.Logger
	ready      func() bool
	adminHash  [sha256.Size]byte
	failures   *failMemory
	authChecks *guessgate.Gate
	anonLocal  *anonLocal
	bulk       *capacity.Gate
	// bulkHeld is the bulk slots each tenant holds (bulkMu), at most
	// bulkShare: one tenant's slow bodies must not take every slot.
	bulkMu    sync.Mutex
	bulkHeld  map[string]int
	bulkShare int
	routes    []route
	m         instruments
	// countsUnimplemented is set while analytics' last answer to
	// GetLinksClickCounts was UNIMPLEMENTED, countsWarned once that was
	// logged (see shlinkSummaries).
	countsUnimplemented atomic.Bool
	countsWarned        atomic.Bool

	// muxOnce builds mux, the generated handlers of the mapped routes.
	muxOnce sync.Once
	mux     *runtime.ServeMux
}

type instruments struct {
	requests     metric.Int64Counter
	duration     metric.Float64Histogram
	degraded     metric.Int64Counter
	authFailures metric.Int64Counter
}

// New builds the API.
func New(opts Options, d Deps) (*API, error) {
	if opts.MaxBodyBytes <= 0 || opts.MaxHeaderBytes <= 0 || opts.CallTimeout <= 0 || opts.MaxBulkRequests <= 0 {
		return nil, errors.New("httpapi: MaxBodyBytes, MaxHeaderBytes, CallTimeout and MaxBulkRequests must be positive")
	}
	if opts.AllowAnonymous && (opts.AnonymousLocal.Limit <= 0 || opts.AnonymousLocal.Burst <= 0) {
		return nil, errors.New("httpapi: AnonymousLocal's Limit and Burst must be positive with AllowAnonymous")
	}
	a := &API{
		opts: opts, shortener: d.Shortener, webhooks: d.Webhooks, analytics: d.Analytics, rulesAdmin: d.RulesAdmin, quota: d.Quota, keys: d.Keys, log: d.Log, ready: d.Ready,
		adminHash:  sha256.Sum256([]byte(opts.AdminToken)),
		failures:   newFailMemory(failMemoryCapacity, defaultFailTTL, time.Now),
		authChecks: guessgate.New(),
		anonLocal:  newAnonLocal(opts.AnonymousLocal, anonLocalCapacity, time.Now),
		// No wait: a bulk request lasts seconds, so a slot rarely frees
		// within a wait worth holding the client for.
		bulk:     capacity.New(opts.MaxBulkRequests, 0),
		bulkHeld: map[string]int{},
		// Half the slots, at least one: with the default two, a tenant
		// sending its bodies a byte a second holds one slot, not both.
		bulkShare: max(1, opts.MaxBulkRequests/2),
	}
	var errs []error
	counter := func(name, desc, unit string) metric.Int64Counter {
		c, err := d.Meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return c
	}
	a.m.requests = counter("kurz.gateway.requests", "HTTP requests by route (mux pattern) and status", "{request}")
	a.m.degraded = counter("kurz.gateway.quota.degraded",
		"Limiter calls that got no answer in time (or FAIL_CLOSED): api quotas failed open (anonymous calls held to the gateway's own bound per address), the auth rule fell back to the gateway's memory of recent failures", "{call}")
	a.m.authFailures = counter("kurz.gateway.auth.failures", "Failed authentications by reason (counted per client IP by the limiter's auth rule)", "{request}")
	var err error
	a.m.duration, err = d.Meter.Float64Histogram("kurz.gateway.request.duration",
		metric.WithDescription("HTTP request latency by route"), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("gateway metrics: %w", err)
	}
	a.routes = a.table()
	for i, rt := range a.routes {
		if rt.rpc != nil {
			a.routes[i].handle = a.serveMapped(rt.pattern, *rt.rpc)
		}
	}
	return a, nil
}

// access is what a route asks of its caller.
type access int

const (
	// public routes need nothing and are not rate-limited (the OpenAPI
	// document).
	public access = iota
	// tenantKey routes need an API key.
	tenantKey
	// tenantOrAnonymous routes take an API key, or act as tenant
	// "anonymous" without one when Options.AllowAnonymous.
	tenantOrAnonymous
	// adminToken routes need the admin token.
	adminToken
	// ownKey routes take an API key the handler finds in the body (the
	// YOURLS API's signature): the handler authenticates the call through
	// authenticateKey and asks edgeQuota itself.
	ownKey
	// shlinkKey routes take an API key in X-Api-Key (Shlink's REST API):
	// authenticated through authenticateKey, then charged to the edge
	// quota as route.charge, the kurz route they mirror, before anything
	// else of the request is checked.
	shlinkKey
)

// route is one registered pattern.
type route struct {
	pattern string // "METHOD /path", as given to http.ServeMux
	access  access
	// query lists the query parameters the route takes; others are a 400.
	query []string
	// handle serves the route; rpc instead, for an RPC the protos map to
	// HTTP, serves it through the generated handler (mapped.go).
	handle func(c *call) error
	rpc    *mapping
	// conditional says that handle takes If-Match itself (c.ifMatch), as
	// a mapping's conditional does.
	conditional bool
	// ownQuery says that handle checks the query string itself (the YOURLS
	// API refuses one with its own answer; Shlink's ignores parameters it
	// does not know).
	ownQuery bool
	// charge is the pattern a shlinkKey route is charged to the edge quota
	// as: the kurz route it mirrors, so that a rule on that route holds
	// whichever API a client speaks; for the YOURLS API's two paths, the
	// one route both are charged as where a call mirrors none. A tenantKey
	// route that does another route's work is charged as that route
	// (POST /v1/links:clickCounts, one statistics query, as statsRoute).
	charge string
	// chargeOf, when set, is the charge of a request on a pattern that
	// serves calls of more than one kurz twin (the Bitly API's
	// /v4/bitlinks/{bitlink}, its clicks under the same prefix).
	chargeOf func(r *http.Request) string
	// shlink says that every refusal of the route, its admission's
	// included, is answered in Shlink's problem shape (shlinkFail).
	shlink bool
	// bitly says the same of Bitly's error shape (bitlyFail).
	bitly bool
}

// Register adds the API's routes to mux. Admin routes are left out when no
// admin token is configured, so they answer 404.
func (a *API) Register(mux *http.ServeMux) {
	for _, rt := range a.routes {
		if rt.access == adminToken && a.opts.AdminToken == "" {
			continue
		}
		mux.Handle(rt.pattern, a.serve(rt))
	}
}

// Routes lists the patterns of every API route (admin ones included), for
// the OpenAPI document's test.
func (a *API) Routes() []string {
	out := make([]string, 0, len(a.routes))
	for _, rt := range a.routes {
		// OpenAPI has no wildcard of several segments: {bitlink...} is
		// documented as {bitlink}.
		out = append(out, strings.ReplaceAll(rt.pattern, "...}", "}"))
	}
	return out
}

// call is one request on its way through a route.
type call struct {
	w  http.ResponseWriter
	r  *http.Request
	st *reqState
	// keyID is the authenticating API key's ID; empty for anonymous calls.
	// key is the key itself, however it was sent (Authorization, Shlink's
	// X-Api-Key, YOURLS's signature, Bitly's bare token): readmit checks
	// it again.
	keyID, key string
	// idempotencyKey is the call's Idempotency-Key, on a route that takes
	// one (mapping.idempotent); the services get it as metadata.
	idempotencyKey string
	// ifMatch are the entity tags of the call's If-Match, on a write that
	// takes it (mapping.conditional); the services get them as metadata.
	ifMatch []string
	// charge is the route the call counts as against the edge quota when
	// it is not its own pattern (route.charge).
	charge string
	// rateLimit is the decision whose RateLimit fields the answer carries
	// (setRateLimit); unset before any.
	rateLimit ruleDecision
}

// tenant is the tenant the call acts for ("" before authentication and on
// admin routes).
func (c *call) tenant() string { return c.st.tenant }

// downstream returns the context for a call to a service behind the
// gateway: tenant, client IP, request ID, idempotency key and If-Match as
// metadata (pkg/callmeta), bounded by the call timeout.
func (a *API) downstream(c *call) (context.Context, context.CancelFunc) {
	return a.downstreamFor(c, a.opts.CallTimeout)
}

// downstreamFor is downstream with another bound, for the bulk calls.
func (a *API) downstreamFor(c *call, timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx := callmeta.Outgoing(c.r.Context(), c.tenant(), c.st.ip)
	ctx = callmeta.OutgoingRequestID(ctx, c.st.id)
	if c.idempotencyKey != "" {
		ctx = callmeta.OutgoingIdempotencyKey(ctx, c.idempotencyKey)
	}
	if len(c.ifMatch) > 0 {
		ctx = callmeta.OutgoingIfMatch(ctx, c.ifMatch)
	}
	return context.WithTimeout(ctx, timeout)
}

// serve runs one route: admission (authentication, brute-force guard, edge
// quota), the check of its path and query parameters, then the handler.
// Every error goes out through toAPIError and writeError.
func (a *API) serve(rt route) http.Handler {
	wildcards := pathWildcards(rt.pattern)
	fail := a.fail
	switch {
	case rt.shlink:
		fail = a.shlinkFail
	case rt.bitly:
		fail = a.bitlyFail
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := &call{w: w, r: r, st: stateOf(r), charge: rt.charge}
		if rt.chargeOf != nil {
			c.charge = rt.chargeOf(r)
		}
		err := a.admit(c, rt)
		if err == nil {
			err = idempotencyKey(c, rt)
		}
		if err == nil {
			err = ifMatch(c, rt)
		}
		if err == nil {
			err = checkPath(r, wildcards)
		}
		if err == nil && !rt.ownQuery {
			err = checkQuery(r, rt.query)
		}
		if err == nil {
			err = rt.handle(c)
		}
		if err != nil {
			fail(c, err)
		}
	})
}

// fail writes err as the error answer, logging what the client does not see.
func (a *API) fail(c *call, err error) {
	writeError(c.w, c.st.id, a.failure(c, err))
}

// failure turns err into the error answer to send, logging what the client
// does not see and dropping the edge quota's fields from a service's 429.
func (a *API) failure(c *call, err error) *apiError {
	e := toAPIError(err)
	if cerr := c.r.Context().Err(); cerr != nil && e.status >= 500 {
		// The client hung up (or the request's deadline passed): what
		// failed on our side failed for that, not for a fault of ours;
		// 499, no log line (a stranger aborting requests must not write
		// the log, nor look like an outage). A refusal of the request
		// itself (a body that could not be read: 400) stands.
		e = toAPIError(cerr)
	}
	if e.status == http.StatusTooManyRequests && !e.ownQuota {
		// A service's quota refused (the link creation quota, say): the
		// edge quota's fields set before would tell the client it has
		// room. Retry-After is the answer's pacing.
		h := c.w.Header()
		delete(h, ratelimitfields.PolicyField)
		delete(h, ratelimitfields.StateField)
	}
	if e.cause != nil && e.status >= 500 {
		a.log.WarnContext(c.r.Context(), "request failed", "route", c.st.route, "status", e.status,
			"request_id", c.st.id, "err", e.cause)
	}
	return e
}

func (a *API) admit(c *call, rt route) error {
	switch rt.access {
	case adminToken:
		return a.authenticateAdmin(c)
	case tenantKey, tenantOrAnonymous:
		if err := a.authenticate(c, rt.access == tenantOrAnonymous, rt.bitly); err != nil {
			return err
		}
		return a.edgeQuota(c, cmp.Or(c.charge, rt.pattern))
	case shlinkKey:
		if err := a.authenticateShlink(c); err != nil {
			return err
		}
		return a.edgeQuota(c, c.charge)
	}
	return nil
}

// edgeQuota asks the limiter about the call (domain api) and writes the
// deciding rule's RateLimit fields. When the limiter does not answer in
// time, a call with an API key passes (its rules are business quotas: a
// broken limiter must not take the product down); an anonymous one is held
// to the gateway's local bound on its address (anonLocal).
func (a *API) edgeQuota(c *call, pattern string) error {
	return a.edgeQuotaCost(c, pattern, 1)
}

// maxQueueWait is the longest the gateway holds a request for its turn in
// a leaky bucket's queue (a rule in queue mode); a turn further off is a
// 429, retrying at that turn (quota.Decision.WithinWait). Well within the
// listener's write timeout (30 s), past which the answer could not be
// written anyway.
const maxQueueWait = 10 * time.Second

// edgeQuotaCost is edgeQuota for a call that does the work of cost calls
// of pattern (a Shlink list reading a thousand links at a time).
func (a *API) edgeQuotaCost(c *call, pattern string, cost uint32) error {
	desc := map[string]string{"tenant": c.tenant(), "route": pattern}
	if c.st.ipKey != "" {
		desc["ip"] = c.st.ipKey
	}
	if c.keyID != "" {
		desc["api_key"] = c.keyID
	}
	ctx := c.r.Context()
	d := a.quota.Check(ctx, DomainAPI, desc, cost, quota.FailOpen).WithinWait(maxQueueWait)
	if d.Abandoned {
		return ctx.Err() // the client is gone: no free pass past its quota
	}
	anonymous := c.keyID == ""
	if d.Degraded {
		a.m.degraded.Add(ctx, 1, metric.WithAttributes(attribute.String("domain", DomainAPI)))
		if !anonymous {
			return nil
		}
		if ok, wait := a.anonLocal.take(c.st.ipKey); !ok {
			retry := max(wait, time.Second)
			e := newError(http.StatusTooManyRequests, "RESOURCE_EXHAUSTED",
				fmt.Sprintf("rate limit exceeded (the gateway's own bound on anonymous requests from one address, while the limiter is slow); retry after %ds", ceilSeconds(retry)))
			e.retryAfter, e.ownQuota, e.reason = retry, true, rpcerr.ReasonRateLimited
			return e
		}
		return nil
	}
	c.setRateLimit(DomainAPI, d)
	if !d.Allowed && d.MaxCost > 0 {
		// No wait lets it pass: a 429 would have the client retry forever.
		return badRequest(fmt.Sprintf("this request counts as %d requests of %s, more than policy %s/%s ever allows at once (%d): it cannot pass however long it waits; ask for less",
			cost, pattern, DomainAPI, d.Rule, d.MaxCost))
	}
	if !d.Allowed {
		return denied(DomainAPI, d, "rate limit exceeded")
	}
	if anonymous {
		a.anonLocal.charge(c.st.ipKey)
	}
	return d.Wait(ctx) // a leaky bucket in queue mode: wait for what is ahead
}
