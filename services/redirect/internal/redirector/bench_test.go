//go:build integration

package redirector

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric/noop"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/geoip"
	"kurz.dev/pkg/geoip/geoiptest"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkrules"
	"kurz.dev/pkg/testkit/redistest"
	"kurz.dev/services/redirect/internal/resolve"
)

type discardClicks struct{}

func (discardClicks) Record(clickevent.Event) {}

// benchConfig is the handler's configuration in the benchmarks.
func benchConfig() Config {
	return Config{DefaultStatus: http.StatusFound, FormSecret: []byte("bench-form-secret-0123456789abcdef"),
		VisitTimeout: time.Second, WalkRate: 10, WalkBurst: 1000}
}

// serveEntries returns a handler without Host routing over a private
// Redis holding entries (written through as the shortener does).
func serveEntries(tb testing.TB, cfg Config, clicks Clicks, entries map[string]linkcache.Entry) *http.ServeMux {
	return serveHosts(tb, cfg, clicks, nil, entries)
}

// serveHosts is serveEntries routing by Host through hosts (nil: none).
func serveHosts(tb testing.TB, cfg Config, clicks Clicks, hosts *Hosts, entries map[string]linkcache.Entry) *http.ServeMux {
	mux, _ := serveRedis(tb, cfg, clicks, hosts, entries)
	return mux
}

// serveRedis is serveHosts returning its private Redis too, which also
// counts the visits of visit-limited links. The handler holds
// otherSuspended, as a production one holds the suspended tenants.
func serveRedis(tb testing.TB, cfg Config, clicks Clicks, hosts *Hosts, entries map[string]linkcache.Entry) (*http.ServeMux, *redis.Client) {
	return serveSuspended(tb, cfg, clicks, hosts, otherSuspended(), entries)
}

// otherSuspended is a set of 100 suspended tenants that no test's links
// belong to.
func otherSuspended() *Suspended {
	m := make(map[string]struct{}, 100)
	for i := range 100 {
		m[fmt.Sprintf("suspended-%d", i)] = struct{}{}
	}
	s := &Suspended{}
	s.Set(m)
	return s
}

// serveSuspended is serveRedis with its set of suspended tenants.
func serveSuspended(tb testing.TB, cfg Config, clicks Clicks, hosts *Hosts, suspended *Suspended, entries map[string]linkcache.Entry) (*http.ServeMux, *redis.Client) {
	tb.Helper()
	node := redistest.Start(tb)
	rdb := redis.NewClient(&redis.Options{Addr: node.Addr})
	tb.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	for key, e := range entries {
		if err := linkcache.WriteThrough(ctx, rdb, key, e, time.Hour); err != nil {
			tb.Fatal(err)
		}
	}
	log := slog.New(slog.DiscardHandler)
	meter := noop.NewMeterProvider().Meter("bench")
	res, err := resolve.New(resolve.Config{L1TTL: time.Hour, L1Size: 1000, RedisTimeout: time.Second, DBTimeout: time.Second}, rdb, nil, log, meter)
	if err != nil {
		tb.Fatal(err)
	}
	h, err := New(cfg, Deps{Resolver: res, Clicks: clicks, Hosts: hosts, Suspended: suspended, Visits: rdb, Log: log}, meter)
	if err != nil {
		tb.Fatal(err)
	}
	mux := http.NewServeMux()
	h.Register(mux)
	return mux, rdb
}

// benchHeader is a desktop browser's request.
var benchHeader = []string{
	"User-Agent", "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36",
	"Accept-Language", "en-US,en;q=0.9,de;q=0",
}

// BenchmarkServeCodeL1Hit is the hot path: GET of a popular plain link
// that L1 holds (a private Redis filled it once), answered 302 with no I/O.
// The handler routes by Host as in production (default hosts configured
// and 1,000 verified custom domains): "default" asks the default host,
// "custom" a custom domain's link (its key "<domain>/<code>"); "nohosts"
// is the handler without Host routing, as before custom domains.
func BenchmarkServeCodeL1Hit(b *testing.B) {
	benchHosts(b, linkcache.Entry{State: linkcache.Active, URL: "https://example.com/", Tenant: "t"})
}

// BenchmarkServeCodeL1HitRules is BenchmarkServeCodeL1Hit for a link with
// rules that do not match (every condition kind but country is tested) and
// variants: the visitor gets a variant.
func BenchmarkServeCodeL1HitRules(b *testing.B) {
	benchHosts(b, linkcache.Entry{State: linkcache.Active, URL: "https://example.com/", Tenant: "t", Rules: BenchRules(b)})
}

// benchHosts runs benchL1Hit on e, as the link "popular" of the default
// domain and of go.acme.test, for each way of routing by Host.
func benchHosts(b *testing.B, e linkcache.Entry) {
	hosts := NewHosts([]string{"kurz.test", "127.0.0.1"})
	domains := map[string]string{"go.acme.test": "t"}
	for i := range 999 {
		domains[fmt.Sprintf("go%d.example.test", i)] = "other"
	}
	hosts.SetDomains(domains)
	entries := map[string]linkcache.Entry{"popular": e, "go.acme.test/popular": e}
	for _, c := range []struct {
		name  string
		hosts *Hosts
		host  string
	}{{"nohosts", nil, "kurz.test"}, {"default", hosts, "kurz.test"}, {"custom", hosts, "go.acme.test"}} {
		b.Run(c.name, func(b *testing.B) {
			benchL1Hit(b, serveHosts(b, benchConfig(), discardClicks{}, c.hosts, entries), c.host)
		})
	}
}

// BenchmarkServeCodeL1HitGeoIP is the hot path with a GeoIP database: each
// click also looks up its client's country.
func BenchmarkServeCodeL1HitGeoIP(b *testing.B) {
	db, err := geoip.Open(geoiptest.Write(b, []geoiptest.Network{{CIDR: "198.51.100.0/24", Country: "DE"}}))
	if err != nil {
		b.Fatal(err)
	}
	cfg := benchConfig()
	cfg.Country = db.Country
	e := linkcache.Entry{State: linkcache.Active, URL: "https://example.com/", Tenant: "t"}
	benchL1Hit(b, serveEntries(b, cfg, discardClicks{}, map[string]linkcache.Entry{"popular": e}), "kurz.test")
}

// benchL1Hit measures GET of /popular on host, a browser's request (the
// same headers and query for every benchmark), once L1 holds it.
func benchL1Hit(b *testing.B, mux *http.ServeMux, host string) {
	req := httptest.NewRequest(http.MethodGet, "/popular?utm_source=news", nil)
	req.Host = host + ":8787"
	req.RemoteAddr = "198.51.100.1:1234"
	for i := 0; i+1 < len(benchHeader); i += 2 {
		req.Header.Set(benchHeader[i], benchHeader[i+1])
	}
	for _, want := range []string{"cache", "l1"} {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		if w.Code != http.StatusFound || w.Header().Get("X-Source") != want {
			b.Fatalf("warm-up: %d from %q, want 302 from %s", w.Code, w.Header().Get("X-Source"), want)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		mux.ServeHTTP(httptest.NewRecorder(), req)
	}
}

// BenchRules is a rule set of the size a campaign link carries: four rules
// no bench visitor matches, then two variants.
func BenchRules(tb testing.TB) *linkrules.Set {
	de := "de"
	s := &linkrules.Set{
		Rules: []linkrules.Rule{
			{Name: "ios-de", If: []linkrules.Condition{{Devices: []string{"ios"}}, {Languages: []string{"de"}}}, URL: "https://example.com/ios-de"},
			{Name: "german", If: []linkrules.Condition{{Languages: []string{"de", "fr"}}}, URL: "https://example.com/de"},
			{Name: "promo", If: []linkrules.Condition{{Query: &linkrules.Query{Param: "utm_source", Value: &de}}}, URL: "https://example.com/promo"},
			{Name: "office", If: []linkrules.Condition{{CIDRs: []string{"203.0.113.0/24", "2001:db8::/32"}}}, URL: "https://example.com/office"},
		},
		Variants: []linkrules.Variant{{Name: "a", URL: "https://example.com/a", Weight: 1}, {Name: "b", URL: "https://example.com/b", Weight: 1}},
	}
	if err := s.Compile(); err != nil {
		tb.Fatal(err)
	}
	return s
}
