package quotaguard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/quotaguard"
	"kurz.dev/pkg/testkit/limitertest"
)

// newClient is a quota client of the limiter at addr.
func newClient(t *testing.T, addr string) *quota.Client {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c, err := quota.New(conn, 5*time.Second, slog.New(slog.DiscardHandler), noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// deadAddr is a loopback address nothing listens on: the limiter is down.
func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// decide answers as a token bucket rule "per-user" of 100 a minute would,
// with remaining left (allowed when remaining >= 0; denied for retry
// otherwise).
func decide(remaining int64, retry, delay time.Duration) limitertest.Decider {
	return func(*ratelimitv1.CheckQuotaRequest) *ratelimitv1.CheckQuotaResponse {
		allowed := remaining >= 0
		reset := time.Duration(100-max(remaining, 0)) * 600 * time.Millisecond
		return &ratelimitv1.CheckQuotaResponse{
			Allowed: allowed, DecidingRule: "per-user", Limit: 100, Remaining: max(remaining, 0),
			ResetAfter: durationpb.New(reset), RetryAfter: durationpb.New(retry),
			Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS,
			Decisions: []*ratelimitv1.RuleDecision{{
				Rule: "per-user", Allowed: allowed, Limit: 100, Remaining: max(remaining, 0),
				Window: durationpb.New(time.Minute), Capacity: 100, Delay: durationpb.New(delay),
				Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS,
			}},
		}
	}
}

// byUser keys every request by its X-User header.
var byUser = quotaguard.Descriptors(map[string]quotaguard.Source{"user": quotaguard.Header("X-User")})

// guarded is the handler o guards over c, and a record of the requests the
// handler served with the decision each carried.
type guarded struct {
	http.Handler
	served []quota.Decision
	// checked is false for a request served that the guard did not check.
	checked []bool
}

func guard(t *testing.T, c *quota.Client, o quotaguard.Options) *guarded {
	t.Helper()
	mw, err := quotaguard.Middleware(c, o)
	if err != nil {
		t.Fatal(err)
	}
	g := &guarded{}
	g.Handler = mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, ok := quotaguard.DecisionFrom(r.Context())
		g.served, g.checked = append(g.served, d), append(g.checked, ok)
		_, _ = w.Write([]byte("ok"))
	}))
	return g
}

func get(h http.Handler, path string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// field1 is h's first value of field, spelt as given: the RateLimit fields
// are set under the draft's spelling, not Go's canonical one.
func field1(h http.Header, field string) string {
	if v := h[field]; len(v) > 0 {
		return v[0]
	}
	return h.Get(field)
}

func TestAllowedRequestCarriesTheRuleFields(t *testing.T) {
	lim := limitertest.Start(t, decide(41, 0, 0))
	g := guard(t, newClient(t, lim.Addr()), quotaguard.Options{Domain: "api", Descriptors: byUser})
	w := get(g, "/items", "X-User", "alice")
	if w.Code != http.StatusOK || len(g.served) != 1 {
		t.Fatalf("status %d, %d served: want 200, the handler called once", w.Code, len(g.served))
	}
	for field, want := range map[string]string{
		"RateLimit-Policy": `"api/per-user";q=100;w=60`,
		"RateLimit":        `"api/per-user";r=41;t=36`,
		"Retry-After":      "",
	} {
		if got := field1(w.Header(), field); got != want {
			t.Errorf("%s: got %q, want %q", field, got, want)
		}
	}
	if d := g.served[0]; !d.Allowed || d.Degraded || d.Rule != "per-user" {
		t.Errorf("the handler's decision: %+v, want the limiter's allowance", d)
	}
	calls := lim.Calls()
	if len(calls) != 1 || calls[0].GetDomain() != "api" || calls[0].GetDescriptors()["user"] != "alice" || calls[0].GetCost() != 1 {
		t.Errorf("the limiter was asked %v, want one check of api {user: alice} costing 1", calls)
	}
}

func TestDeniedRequestIsA429Problem(t *testing.T) {
	lim := limitertest.Start(t, decide(-1, 2500*time.Millisecond, 0))
	g := guard(t, newClient(t, lim.Addr()), quotaguard.Options{Domain: "api", Descriptors: byUser})
	w := get(g, "/items", "X-User", "alice")
	if w.Code != http.StatusTooManyRequests || len(g.served) != 0 {
		t.Fatalf("status %d, %d served: want 429, the handler not called", w.Code, len(g.served))
	}
	for field, want := range map[string]string{
		"Retry-After":      "3",
		"RateLimit-Policy": `"api/per-user";q=100;w=60`,
		"RateLimit":        `"api/per-user";r=0;t=60`,
		"Content-Type":     "application/problem+json",
		"Cache-Control":    "no-store",
	} {
		if got := field1(w.Header(), field); got != want {
			t.Errorf("%s: got %q, want %q", field, got, want)
		}
	}
	var got map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatalf("body %q: %v", w.Body, err)
	}
	want := map[string]any{
		"type": "https://kurz.dev/problems/resource-exhausted", "title": "Too many requests", "status": 429.0,
		"detail": "rate limit exceeded (policy api/per-user); retry after 3s", "code": "RESOURCE_EXHAUSTED",
		"retryAfterMs": 2500.0, "reason": "RATE_LIMITED",
	}
	if len(got) != len(want) {
		t.Errorf("body %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("body %s: got %v, want %v", k, got[k], v)
		}
	}
}

// A request that costs more than the rule ever holds is never allowed: no
// Retry-After would have the client wait for nothing.
func TestCostOverTheRuleCapacityHasNoRetryAfter(t *testing.T) {
	lim := limitertest.Start(t, decide(-1, time.Minute, 0))
	g := guard(t, newClient(t, lim.Addr()), quotaguard.Options{Domain: "api", Descriptors: byUser,
		Cost: func(*http.Request) uint32 { return 500 }})
	w := get(g, "/items", "X-User", "alice")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "" {
		t.Errorf("status %d, Retry-After %q: want 429 without it", w.Code, w.Header().Get("Retry-After"))
	}
	if !strings.Contains(w.Body.String(), "cannot pass however long it waits") {
		t.Errorf("body %s: want it to say waiting does not help", w.Body)
	}
}

func TestLimiterDownAppliesThePolicy(t *testing.T) {
	c := newClient(t, deadAddr(t))
	t.Run("fail open passes", func(t *testing.T) {
		g := guard(t, c, quotaguard.Options{Domain: "api", Descriptors: byUser, Policy: quota.FailOpen})
		w := get(g, "/items", "X-User", "alice")
		if w.Code != http.StatusOK || len(g.served) != 1 {
			t.Fatalf("status %d, %d served: want 200, the handler called", w.Code, len(g.served))
		}
		if d := g.served[0]; !d.Degraded {
			t.Errorf("the handler's decision %+v: want it marked Degraded", d)
		}
		if f := field1(w.Header(), "RateLimit"); f != "" {
			t.Errorf("RateLimit %q on an answer no rule decided", f)
		}
	})
	t.Run("fail closed denies", func(t *testing.T) {
		g := guard(t, c, quotaguard.Options{Domain: "api", Descriptors: byUser, Policy: quota.FailClosed})
		w := get(g, "/items", "X-User", "alice")
		if w.Code != http.StatusServiceUnavailable || len(g.served) != 0 {
			t.Fatalf("status %d, %d served: want 503, the handler not called", w.Code, len(g.served))
		}
		if ra := w.Header().Get("Retry-After"); ra != "1" {
			t.Errorf("Retry-After %q, want 1", ra)
		}
		if !strings.Contains(w.Body.String(), `"reason":"RATE_LIMITER_UNAVAILABLE"`) {
			t.Errorf("body %s: want reason RATE_LIMITER_UNAVAILABLE", w.Body)
		}
	})
}

func TestSkippedRequestsAreNotChecked(t *testing.T) {
	lim := limitertest.Start(t, decide(-1, time.Minute, 0))
	g := guard(t, newClient(t, lim.Addr()), quotaguard.Options{Domain: "api",
		Descriptors: func(r *http.Request) (map[string]string, bool) {
			return map[string]string{"user": "alice"}, r.URL.Path != "/healthz"
		}})
	if w := get(g, "/healthz"); w.Code != http.StatusOK || len(g.served) != 1 || g.checked[0] {
		t.Errorf("status %d, served %d, checked %v: want 200, served unchecked", w.Code, len(g.served), g.checked)
	}
	if n := len(lim.Calls()); n != 0 {
		t.Errorf("the limiter was asked %d times about a skipped request", n)
	}
}

func TestCostIsSentBounded(t *testing.T) {
	for name, tc := range map[string]struct{ cost, sent uint32 }{
		"given":        {5, 5},
		"zero is one":  {0, 1},
		"over the max": {quotaguard.MaxCost + 1, quotaguard.MaxCost},
	} {
		t.Run(name, func(t *testing.T) {
			lim := limitertest.Start(t, limitertest.AllowAll)
			g := guard(t, newClient(t, lim.Addr()), quotaguard.Options{Domain: "api", Descriptors: byUser,
				Cost: func(*http.Request) uint32 { return tc.cost }})
			get(g, "/items", "X-User", "alice")
			if calls := lim.Calls(); len(calls) != 1 || calls[0].GetCost() != tc.sent {
				t.Errorf("calls %v: want one costing %d", calls, tc.sent)
			}
		})
	}
}

// A client that hangs up before the limiter answers gets nothing past the
// limit, fail-open or not.
func TestAbandonedRequestGetsNoAnswer(t *testing.T) {
	lim := limitertest.Start(t, limitertest.AllowAll)
	g := guard(t, newClient(t, lim.Addr()), quotaguard.Options{Domain: "api", Descriptors: byUser, Policy: quota.FailOpen})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/items", nil)
	w := httptest.NewRecorder()
	g.ServeHTTP(w, r)
	if w.Code != 499 || len(g.served) != 0 || w.Body.Len() != 0 {
		t.Errorf("status %d, %d served, body %q: want 499, nothing served or said", w.Code, len(g.served), w.Body)
	}
}

// A leaky bucket in queue mode delays the request; a client gone while it
// waits gets no answer either.
func TestQueuedRequestWaitsForItsTurn(t *testing.T) {
	t.Run("served after the delay", func(t *testing.T) {
		lim := limitertest.Start(t, decide(10, 0, time.Millisecond))
		g := guard(t, newClient(t, lim.Addr()), quotaguard.Options{Domain: "api", Descriptors: byUser})
		if w := get(g, "/items", "X-User", "alice"); w.Code != http.StatusOK || len(g.served) != 1 {
			t.Errorf("status %d, %d served: want 200 once its turn came", w.Code, len(g.served))
		}
	})
	t.Run("client gone while waiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		lim := limitertest.Start(t, func(req *ratelimitv1.CheckQuotaRequest) *ratelimitv1.CheckQuotaResponse {
			// The client hangs up as its hour-long turn is given: whether
			// the answer reaches the guard first or not, nothing is served.
			cancel()
			return decide(10, 0, time.Hour)(req)
		})
		g := guard(t, newClient(t, lim.Addr()), quotaguard.Options{Domain: "api", Descriptors: byUser})
		w := httptest.NewRecorder()
		g.ServeHTTP(w, httptest.NewRequestWithContext(ctx, http.MethodGet, "/items", nil))
		if w.Code != 499 || len(g.served) != 0 {
			t.Errorf("status %d, %d served: want 499, nothing served", w.Code, len(g.served))
		}
	})
}

// Values a stranger sends that the limiter would refuse (too long, not
// UTF-8) would leave the check to the failure policy: they are sent as
// digests, two values still two keys.
func TestStrangerValuesAreBounded(t *testing.T) {
	lim := limitertest.Start(t, limitertest.AllowAll)
	g := guard(t, newClient(t, lim.Addr()), quotaguard.Options{Domain: "api", Descriptors: byUser})
	long := strings.Repeat("a", quotaguard.MaxValueBytes+1)
	for _, v := range []string{long, long + "b", "caf\xe9", strings.Repeat("a", quotaguard.MaxValueBytes)} {
		get(g, "/items", "X-User", v)
	}
	calls := lim.Calls()
	if len(calls) != 4 {
		t.Fatalf("%d calls, want 4", len(calls))
	}
	seen := map[string]bool{}
	for i, c := range calls[:3] {
		v := c.GetDescriptors()["user"]
		if !strings.HasPrefix(v, "sha256:") || len(v) != len("sha256:")+64 || seen[v] {
			t.Errorf("value %d sent as %q: want a digest of its own", i, v)
		}
		seen[v] = true
	}
	if v := calls[3].GetDescriptors()["user"]; v != strings.Repeat("a", quotaguard.MaxValueBytes) {
		t.Errorf("a value at the bound was sent as %.20q…, want it as it is", v)
	}
	for i, d := range g.served {
		if d.Degraded {
			t.Errorf("request %d was decided by the policy, not the limiter", i)
		}
	}
}

func TestSources(t *testing.T) {
	trusted, err := clientip.New([]string{"10.0.0.0/8"}, "")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /items/{id}", func(http.ResponseWriter, *http.Request) {})
	src := quotaguard.Descriptors(map[string]quotaguard.Source{
		"ip": quotaguard.ClientIP(trusted, clientip.Keying{}), "route": quotaguard.Route(mux),
		"method": quotaguard.Method, "user": quotaguard.Header("x-user"),
	})
	for name, tc := range map[string]struct {
		method, peer, forwarded, user, path string
		want                                map[string]string
	}{
		"direct client, forwarded header ignored": {"GET", "203.0.113.7:4000", "198.51.100.1", "alice", "/items/1",
			map[string]string{"ip": "203.0.113.7", "route": "GET /items/{id}", "method": "GET", "user": "alice"}},
		"through a trusted proxy": {"GET", "10.1.2.3:4000", "198.51.100.1", "", "/items/1",
			map[string]string{"ip": "198.51.100.1", "route": "GET /items/{id}", "method": "GET"}},
		"IPv6 by its /64, no route, odd method": {"BREW", "[2001:db8:1:2::9]:4000", "", "", "/nowhere",
			map[string]string{"ip": "2001:db8:1:2::/64", "method": "OTHER"}},
	} {
		t.Run(name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, tc.path, nil)
			r.RemoteAddr = tc.peer
			if tc.forwarded != "" {
				r.Header.Set("X-Forwarded-For", tc.forwarded)
			}
			if tc.user != "" {
				r.Header.Set("X-User", tc.user)
			}
			got, check := src(r)
			if !check || len(got) != len(tc.want) {
				t.Fatalf("got %v (check %v), want %v", got, check, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s: got %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

func TestMiddlewareRefusesAnIncompleteSetup(t *testing.T) {
	c := newClient(t, deadAddr(t))
	for name, tc := range map[string]struct {
		c    *quota.Client
		o    quotaguard.Options
		want string
	}{
		"no client":      {nil, quotaguard.Options{Domain: "api", Descriptors: byUser}, "no limiter client"},
		"no domain":      {c, quotaguard.Options{Descriptors: byUser}, "Domain is empty"},
		"no descriptors": {c, quotaguard.Options{Domain: "api"}, "Descriptors is nil"},
		"odd policy":     {c, quotaguard.Options{Domain: "api", Descriptors: byUser, Policy: 7}, "unknown failure policy 7"},
		"negative wait":  {c, quotaguard.Options{Domain: "api", Descriptors: byUser, MaxWait: -time.Second}, "Options.MaxWait is -1s"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := quotaguard.Middleware(tc.c, tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// A queued turn longer than the guard waits (a rule's queue set larger
// than its author meant, or keyed on a value a client varies) would hold a
// goroutine and a connection each until the client gave up: the request
// is refused at once, told to come back when its turn would have come.
func TestOverlongQueueWaitIsRefused(t *testing.T) {
	lim := limitertest.Start(t, decide(10, 0, time.Hour))
	g := guard(t, newClient(t, lim.Addr()), quotaguard.Options{Domain: "api", Descriptors: byUser})
	// The deadline only ends a guard that waits: it decides nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/items", nil)
	r.Header.Set("X-User", "alice")
	w := httptest.NewRecorder()
	g.ServeHTTP(w, r)
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "3600" || len(g.served) != 0 {
		t.Errorf("status %d, Retry-After %q, %d served: want 429, 3600, nothing served", w.Code, w.Header().Get("Retry-After"), len(g.served))
	}
}

// A digest stands for a value too long to send: a client that sends the
// digest itself is not that value's key (whoever sent it, and its count).
func TestDigestSentAsAValueIsNotTheValuesKey(t *testing.T) {
	lim := limitertest.Start(t, limitertest.AllowAll)
	g := guard(t, newClient(t, lim.Addr()), quotaguard.Options{Domain: "api", Descriptors: byUser})
	long := strings.Repeat("a", quotaguard.MaxValueBytes+1)
	get(g, "/items", "X-User", long)
	digest := lim.Calls()[0].GetDescriptors()["user"]
	get(g, "/items", "X-User", digest)
	if got := lim.Calls()[1].GetDescriptors()["user"]; got == digest {
		t.Errorf("the digest %q sent as a value was checked as the long value's key", got)
	}
}

// A Keying that would key unrelated clients as one (an IPv6 prefix shorter
// than /48: every visitor of an ISP under one limit) or that Key cannot
// use (negative, past 128) is refused when the source is made, naming the
// bad prefix, rather than misbehaving on every request; the zero Keying is
// the /64 default.
func TestIPSourcesRefuseABadKeying(t *testing.T) {
	for _, prefix := range []int{0, 48, 64, 128} {
		for name, mk := range map[string]func(clientip.Keying){
			"ClientIP": func(k clientip.Keying) { quotaguard.ClientIP(nil, k) },
			"PeerIP":   func(k clientip.Keying) { quotaguard.PeerIP(k) },
		} {
			if msg := panicOf(func() { mk(clientip.Keying{IPv6Prefix: prefix}) }); msg != "" {
				t.Errorf("%s with IPv6Prefix %d: %s; want it taken", name, prefix, msg)
			}
		}
	}
	for _, prefix := range []int{16, 47, -1, 129} {
		for name, mk := range map[string]func(clientip.Keying){
			"ClientIP": func(k clientip.Keying) { quotaguard.ClientIP(nil, k) },
			"PeerIP":   func(k clientip.Keying) { quotaguard.PeerIP(k) },
		} {
			msg := panicOf(func() { mk(clientip.Keying{IPv6Prefix: prefix}) })
			if want := fmt.Sprintf("IPv6Prefix is %d: want 0 (the default, /64) or 48 to 128", prefix); !strings.Contains(msg, want) || !strings.Contains(msg, name) {
				t.Errorf("%s with IPv6Prefix %d: panic %q; want one naming %s and saying %q", name, prefix, msg, name, want)
			}
		}
	}
}

// panicOf runs f and returns what it panicked with, "" if it did not.
func panicOf(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
			if msg == "" {
				msg = "(empty panic)"
			}
		}
	}()
	f()
	return ""
}
