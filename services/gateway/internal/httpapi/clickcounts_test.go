package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/quota"
)

// tenantAnalytics is shlinkAnalytics recording the tenant each
// GetLinksClickCounts carried.
type tenantAnalytics struct {
	*shlinkAnalytics
	tenants []string
}

func (s *tenantAnalytics) GetLinksClickCounts(ctx context.Context, in *analyticsv1.GetLinksClickCountsRequest, opts ...grpc.CallOption) (*analyticsv1.GetLinksClickCountsResponse, error) {
	md, _ := metadata.FromOutgoingContext(ctx)
	s.tenants = append(s.tenants, strings.Join(md.Get(callmeta.TenantKey), ","))
	return s.shlinkAnalytics.GetLinksClickCounts(ctx, in, opts...)
}

// clickCountsEnv is the API over the Shlink tests' limiter and keys, with
// tenantAnalytics, served as the gateway serves it.
type clickCountsEnv struct {
	handler   http.Handler
	limiter   *shlinkLimiter
	analytics *tenantAnalytics
}

func newClickCountsEnv(t *testing.T) *clickCountsEnv {
	t.Helper()
	env := &clickCountsEnv{limiter: &shlinkLimiter{}, analytics: &tenantAnalytics{shlinkAnalytics: &shlinkAnalytics{
		counts: &analyticsv1.ClickCounts{Total: 7, Human: 4, Bot: 2, Flood: 1},
		byCode: map[string]*analyticsv1.ClickCounts{"busy123": {Total: 42, Human: 40, Bot: 2}},
	}}}
	env.handler = serveFakes(t, env.limiter, Deps{Shortener: &shlinkShortener{}, Analytics: env.analytics, Ready: func() bool { return true }})
	return env
}

// serveFakes is the API over deps' services and log (none: discarded),
// limiter and the Shlink tests' keys (shlinkKeys), served as the gateway
// serves it (Wrap over its routes): a 4 KiB body bound, a 1 s call
// timeout, one bulk slot.
func serveFakes(t *testing.T, limiter *shlinkLimiter, deps Deps) http.Handler {
	t.Helper()
	q, err := quota.New(limiter, time.Second, slog.New(slog.DiscardHandler), noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	deps.Quota, deps.Keys, deps.Meter = q, shlinkKeys{}, noop.NewMeterProvider().Meter("test")
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	a, err := New(Options{MaxBodyBytes: 4096, MaxHeaderBytes: 16 << 10, CallTimeout: time.Second, MaxBulkRequests: 1,
		DefaultDomain: shlinkDefaultDomain}, deps)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	a.Register(mux)
	return a.Wrap(mux)
}

// post sends body to POST /v1/links:clickCounts with key as the bearer
// token ("" sends none).
func (env *clickCountsEnv) post(body, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/v1/links:clickCounts", strings.NewReader(body))
	if key != "" {
		r.Header.Set("Authorization", "Bearer "+key)
	}
	w := httptest.NewRecorder()
	env.handler.ServeHTTP(w, r)
	return w
}

// linkRefs is a clickCounts body naming n links code000000… on domain
// (none: the default domain).
func linkRefs(n int, domain string) string {
	refs := make([]string, n)
	for i := range refs {
		ref := fmt.Sprintf(`{"code":"code%06d"`, i)
		if domain != "" {
			ref += `,"domain":"` + domain + `"`
		}
		refs[i] = ref + "}"
	}
	return `{"links":[` + strings.Join(refs, ",") + `]}`
}

// POST /v1/links:clickCounts answers each link's counts from one analytics
// call, which carries the API key's tenant, and is charged once, as the
// stats route.
func TestClickCountsAnswersFromOneCallChargedAsStats(t *testing.T) {
	env := newClickCountsEnv(t)
	w := env.post(`{"links":[{"code":"busy123"},{"code":"quiet12","domain":"go.example.com"}],"startTime":"2026-01-01T00:00:00Z"}`, shlinkGoodKey)
	if w.Code != http.StatusOK {
		t.Fatalf("got %d %s, want 200", w.Code, w.Body)
	}
	var got struct {
		Links []struct {
			Code, Domain string
			Counts       struct{ Total, Bot string }
		}
	}
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatalf("body %s: %v", w.Body, err)
	}
	if len(got.Links) != 2 || got.Links[0].Code != "busy123" || got.Links[0].Counts.Total != "42" ||
		got.Links[1].Domain != "go.example.com" || got.Links[1].Counts.Total != "7" {
		t.Errorf("answer %s, want busy123 with 42 clicks, then quiet12 on go.example.com with 7", w.Body)
	}
	b := env.analytics.batches
	if len(b) != 1 || len(b[0].GetLinks()) != 2 || b[0].GetStartTime().AsTime() != time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) {
		t.Errorf("analytics asked %v, want one call naming both links from 2026-01-01", b)
	}
	if !slices.Equal(env.analytics.tenants, []string{"acme"}) {
		t.Errorf("analytics called for tenants %q, want the key's tenant acme", env.analytics.tenants)
	}
	if charged := env.limiter.takeCharged(); !slices.Equal(charged, []string{statsRoute}) {
		t.Errorf("charged %v, want once as %s", charged, statsRoute)
	}
}

// A full list of 1,000 links on a long custom domain passes, past the
// gateway's usual body bound, in one analytics call; no links, more than
// 1,000, or a body over the route's bound are refused before analytics is
// asked. Every call is charged (admission comes before the body).
func TestClickCountsBounds(t *testing.T) {
	long := strings.Repeat("a", 60) + "." + strings.Repeat("b", 60) + ".example.com"
	for _, tc := range []struct {
		name, body string
		status     int
		detail     string
	}{
		{"1,000 links on a long domain", linkRefs(1000, long), http.StatusOK, ""},
		{"no links", `{"links":[]}`, http.StatusBadRequest, `must name 1 to 1000 links; it names 0`},
		{"no body", ``, http.StatusBadRequest, ""},
		{"1,001 links", linkRefs(1001, ""), http.StatusBadRequest, `must name 1 to 1000 links; it names more than 1000`},
		{"a body over the bound", `{"links":[{"code":"abcd123","domain":"` + strings.Repeat("x", clickCountsBodyBytes) + `"}]}`, http.StatusRequestEntityTooLarge, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newClickCountsEnv(t)
			w := env.post(tc.body, shlinkGoodKey)
			if w.Code != tc.status || !strings.Contains(w.Body.String(), tc.detail) {
				t.Errorf("got %d %s, want %d saying %q", w.Code, w.Body, tc.status, tc.detail)
			}
			wantCalls := 0
			if tc.status == http.StatusOK {
				wantCalls = 1
			}
			if n := len(env.analytics.batches); n != wantCalls {
				t.Errorf("analytics asked %d times, want %d", n, wantCalls)
			}
			want := 1
			if tc.status == http.StatusOK {
				want = 10 // one per 100 links
			}
			if charged := env.limiter.takeCharged(); !slices.Equal(charged, slices.Repeat([]string{statsRoute}, want)) {
				t.Errorf("charged %v, want %d times as %s", charged, want, statsRoute)
			}
		})
	}
}

// A call is charged as the stats route once per 100 links it names, before
// analytics is asked: one unit buys no more than 100 links' counts. A
// call the key cannot pay now is a 429, one past what its rule ever holds
// a 400 naming the links; analytics is asked for neither.
func TestClickCountsChargedPerHundredLinks(t *testing.T) {
	for _, tc := range []struct{ links, charges int }{{1, 1}, {100, 1}, {101, 2}, {1000, 10}} {
		env := newClickCountsEnv(t)
		w := env.post(linkRefs(tc.links, ""), shlinkGoodKey)
		if charged := env.limiter.takeCharged(); w.Code != http.StatusOK || !slices.Equal(charged, slices.Repeat([]string{statsRoute}, tc.charges)) {
			t.Errorf("%d links: %d, charged %v; want 200, charged %d times as %s", tc.links, w.Code, charged, tc.charges, statsRoute)
		}
	}
	env := newClickCountsEnv(t)
	env.limiter.denyAbove = 4
	if w := env.post(linkRefs(1000, ""), shlinkGoodKey); w.Code != http.StatusTooManyRequests || len(env.analytics.batches) != 0 {
		t.Errorf("1,000 links, the key unable to pay 9 more now: %d, analytics asked %d times; want 429, never", w.Code, len(env.analytics.batches))
	}
	env.limiter.capacity = true
	w := env.post(linkRefs(1000, ""), shlinkGoodKey)
	if want := `names 1000 links, charged as 10 requests`; w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), want) || len(env.analytics.batches) != 0 {
		t.Errorf("1,000 links past what the rule holds: %d %.300s, analytics asked %d times; want 400 saying %q, never", w.Code, w.Body, len(env.analytics.batches), want)
	}
}

// Without an API key the route is a 401, and with the stats route's quota
// spent a 429: analytics is not asked either way.
func TestClickCountsNeedsAKeyAndTheStatsQuota(t *testing.T) {
	env := newClickCountsEnv(t)
	if w := env.post(`{"links":[{"code":"abcd123"}]}`, ""); w.Code != http.StatusUnauthorized {
		t.Errorf("without a key: %d %s, want 401", w.Code, w.Body)
	}
	env.limiter.denyRoute = statsRoute
	if w := env.post(`{"links":[{"code":"abcd123"}]}`, shlinkGoodKey); w.Code != http.StatusTooManyRequests {
		t.Errorf("the stats route refused: %d %s, want 429", w.Code, w.Body)
	}
	if n := len(env.analytics.batches); n != 0 {
		t.Errorf("analytics asked %d times, want never", n)
	}
}
