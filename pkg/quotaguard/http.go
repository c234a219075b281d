package quotaguard

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/ratelimitfields"
	"kurz.dev/pkg/rpcerr"
)

// Options say what Middleware asks the limiter about each request.
type Options struct {
	// Domain is the limiter domain whose rules decide (required).
	Domain string
	// Descriptors are the descriptors of a request (required); ok false
	// lets the request through unchecked (health checks, say).
	// Descriptors(map[string]Source{...}) builds one from the Sources
	// below. Values are made ones the limiter takes (see the package
	// comment); names are the program's, at most 32 of 1 to 64 bytes, or
	// the limiter refuses every check (as it does a Domain it does not
	// know): Policy still decides, the client logging an error and
	// counting outcome "invalid" (quota.Decision.Invalid).
	Descriptors func(*http.Request) (map[string]string, bool)
	// Cost is what a request costs: nil or 0 is 1, over MaxCost is MaxCost.
	Cost func(*http.Request) uint32
	// Policy decides when the limiter does not answer within the client's
	// timeout: quota.FailOpen (the zero value) lets the request through,
	// quota.FailClosed refuses it.
	Policy quota.Policy
	// MaxWait is the longest a request waits for the turn a leaky bucket
	// in queue mode gives it (0 is DefaultMaxWait); a turn further off is
	// refused as a denial whose Retry-After is that turn.
	MaxWait time.Duration
	// Denied answers a refused request: denied by a rule, or undecided
	// under FailClosed (d.Degraded). Its RateLimit fields are already
	// set. nil is WriteDenied.
	Denied func(w http.ResponseWriter, r *http.Request, d quota.Decision)
}

// Middleware returns the handler wrapper that asks the limiter, through c,
// about every request o's Descriptors checks, before the wrapped handler
// sees it:
//
//   - every answer on which a rule decided carries that rule's RateLimit
//     and RateLimit-Policy fields (allowed or not), as the gateway's do;
//   - a denial is answered by o.Denied, the handler never called;
//   - an allowance the limiter delays (a leaky bucket in queue mode) waits
//     for its turn, or until the request's context ends; a turn further
//     off than o.MaxWait is a denial;
//   - a request whose client hung up before the limiter answered gets a
//     499 and nothing else: under FailOpen it would otherwise pass every
//     limit for free (its client may still read the answer).
//
// The handler finds the decision in its request's context (DecisionFrom).
func Middleware(c *quota.Client, o Options) (func(http.Handler) http.Handler, error) {
	if err := checkSetup(c, "Options", o.Domain, o.Descriptors != nil, o.Policy, o.MaxWait); err != nil {
		return nil, err
	}
	denied := o.Denied
	if denied == nil {
		domain := o.Domain
		denied = func(w http.ResponseWriter, _ *http.Request, d quota.Decision) { WriteDenied(w, domain, d) }
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			desc, check := o.Descriptors(r)
			if !check {
				next.ServeHTTP(w, r)
				return
			}
			var cost uint32
			if o.Cost != nil {
				cost = o.Cost(r)
			}
			ctx := r.Context()
			d := boundedWait(c.Check(ctx, o.Domain, bounded(desc), boundedCost(cost), o.Policy), o.MaxWait)
			if d.Abandoned {
				w.WriteHeader(statusClientClosed)
				return
			}
			if q, ok := d.Fields(o.Domain); ok {
				policy, state := ratelimitfields.Fields(q)
				h := w.Header()
				h[ratelimitfields.PolicyField] = []string{policy}
				h[ratelimitfields.StateField] = []string{state}
			}
			r = r.WithContext(context.WithValue(ctx, decisionKey{}, d))
			if !d.Allowed {
				denied(w, r, d)
				return
			}
			if d.Wait(ctx) != nil {
				w.WriteHeader(statusClientClosed)
				return
			}
			next.ServeHTTP(w, r)
		})
	}, nil
}

// problemType is the base of the type URIs of the problem details kurz
// answers (the gateway's, documented in docs/api.md).
const problemType = "https://kurz.dev/problems/"

// problem is the RFC 9457 problem detail (application/problem+json) of a
// refusal, with the gateway's extensions.
type problem struct {
	Type         string `json:"type"`
	Title        string `json:"title"`
	Status       int    `json:"status"`
	Detail       string `json:"detail"`
	Code         string `json:"code"`
	RetryAfterMS int64  `json:"retryAfterMs,omitempty"`
	Reason       string `json:"reason"`
}

// WriteDenied answers a request d refused as the gateway answers its own:
// a problem detail, with Retry-After in whole seconds (at least one):
//
//   - denied by a rule of domain: 429, RESOURCE_EXHAUSTED, reason
//     RATE_LIMITED; without Retry-After when the request costs more than
//     the rule ever holds (d.MaxCost), which no wait lifts;
//   - undecided under FailClosed (d.Degraded): 503, UNAVAILABLE, reason
//     RATE_LIMITER_UNAVAILABLE, Retry-After: 1.
//
// A custom Options.Denied may call it for the cases it leaves alone.
func WriteDenied(w http.ResponseWriter, domain string, d quota.Decision) {
	p := problem{Type: problemType + "resource-exhausted", Title: "Too many requests", Status: http.StatusTooManyRequests,
		Code: "RESOURCE_EXHAUSTED", Reason: rpcerr.ReasonRateLimited, Detail: deniedMessage(domain, d)}
	var retry time.Duration
	switch {
	case d.Degraded:
		p = problem{Type: problemType + "unavailable", Title: "Service unavailable", Status: http.StatusServiceUnavailable,
			Code: "UNAVAILABLE", Reason: rpcerr.ReasonLimiterUnavailable}
		retry = time.Second
		p.Detail = limiterDownMessage + "; retry after 1s"
	case d.MaxCost == 0:
		retry = d.ComeBackAfter()
		p.Detail += "; retry after " + strconv.FormatInt(ratelimitfields.CeilSeconds(retry), 10) + "s"
	}
	h := w.Header()
	if retry > 0 {
		h.Set("Retry-After", strconv.FormatInt(ratelimitfields.CeilSeconds(retry), 10))
		p.RetryAfterMS = int64((retry + time.Millisecond - 1) / time.Millisecond)
	}
	b, _ := json.Marshal(p) // strings and integers: it cannot fail
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(b, '\n'))
}

// A Source is one descriptor's value for a request; ok false leaves the
// descriptor out of the check, so that a rule keyed on it does not apply
// (the limiter reads an empty value so too).
type Source func(*http.Request) (value string, ok bool)

// Descriptors is an Options.Descriptors that checks every request with the
// descriptors sources yield, by name.
func Descriptors(sources map[string]Source) func(*http.Request) (map[string]string, bool) {
	return func(r *http.Request) (map[string]string, bool) {
		desc := make(map[string]string, len(sources))
		for name, src := range sources {
			if v, ok := src(r); ok && v != "" {
				desc[name] = v
			}
		}
		return desc, true
	}
}

// ClientIP is the limiter key of the request's client (pkg/clientip): its
// connection's peer, or, from a proxy p trusts, the address that proxy
// names (a nil p trusts none: X-Forwarded-For is never believed from
// anyone else); an IPv6 client keyed by its prefix (k's, /64 by default),
// so that one subscriber is one key. It panics when k's IPv6Prefix is
// neither 0 nor clientip.MinIPv6Prefix to 128: a shorter prefix would put
// a whole network's clients under one limit.
func ClientIP(p *clientip.Policy, k clientip.Keying) Source {
	mustKeying("ClientIP", k)
	return func(r *http.Request) (string, bool) {
		key := k.Key(p.Client(r))
		return key, key != ""
	}
}

// Header is the value of the request's header name (its first), left out
// when absent or empty. The client chooses it: key a rule on a header
// your own authentication sets (a user ID), not on one a client can drop
// to escape the rule or vary to get a key of its own each time, and never
// on a credential, which would be kept in Redis and the limiter's
// decision log.
func Header(name string) Source {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, bool) {
		v := r.Header.Get(name)
		return v, v != ""
	}
}

// Route is the pattern of the route that serves the request ("GET
// /v1/items/{id}"): r.Pattern when the guard wraps a handler the mux calls,
// else the pattern mux would choose when it wraps the whole mux (nil mux:
// r.Pattern alone). A request no route serves leaves it out. Patterns are
// the program's, so a client makes no key of its own with it.
func Route(mux *http.ServeMux) Source {
	return func(r *http.Request) (string, bool) {
		if r.Pattern != "" {
			return r.Pattern, true
		}
		if mux == nil {
			return "", false
		}
		_, pattern := mux.Handler(r)
		return pattern, pattern != ""
	}
}

// Method is the request's method, any but the nine of RFC 9110 and RFC
// 5789 named "OTHER": a client may send any token, each of which would be
// a key.
func Method(r *http.Request) (string, bool) {
	if methods[r.Method] {
		return r.Method, true
	}
	return "OTHER", true
}

// methods are the request methods a Method descriptor names as they are;
// any other is "OTHER", so that a stranger cannot make a key of each.
var methods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodConnect: true,
	http.MethodOptions: true, http.MethodTrace: true,
}
