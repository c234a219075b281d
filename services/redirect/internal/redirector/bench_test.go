//go:build integration

package redirector

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric/noop"

	"kurz.dev/pkg/clickevent"
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

// serveEntries returns a handler over a private Redis holding entries
// (written through as the shortener does).
func serveEntries(tb testing.TB, cfg Config, clicks Clicks, entries map[string]linkcache.Entry) *http.ServeMux {
	tb.Helper()
	node := redistest.Start(tb)
	rdb := redis.NewClient(&redis.Options{Addr: node.Addr})
	tb.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	for code, e := range entries {
		if err := linkcache.WriteThrough(ctx, rdb, code, e, time.Hour); err != nil {
			tb.Fatal(err)
		}
	}
	log := slog.New(slog.DiscardHandler)
	meter := noop.NewMeterProvider().Meter("bench")
	res, err := resolve.New(resolve.Config{L1TTL: time.Hour, L1Size: 1000, RedisTimeout: time.Second, DBTimeout: time.Second}, rdb, nil, log, meter)
	if err != nil {
		tb.Fatal(err)
	}
	h, err := New(cfg, Deps{Resolver: res, Clicks: clicks, Log: log}, meter)
	if err != nil {
		tb.Fatal(err)
	}
	mux := http.NewServeMux()
	h.Register(mux)
	return mux
}

// benchL1Hit measures GET of a popular code that L1 holds (a private Redis
// filled it once), answered 302 with no I/O.
func benchL1Hit(b *testing.B, e linkcache.Entry, header ...string) {
	mux := serveEntries(b, benchConfig(), discardClicks{}, map[string]linkcache.Entry{"popular": e})
	req := httptest.NewRequest(http.MethodGet, "/popular?utm_source=news", nil)
	req.RemoteAddr = "198.51.100.1:1234"
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
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

// benchHeader is a desktop browser's request.
var benchHeader = []string{
	"User-Agent", "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36",
	"Accept-Language", "en-US,en;q=0.9,de;q=0",
}

// BenchmarkServeCodeL1Hit is the hot path: a plain link.
func BenchmarkServeCodeL1Hit(b *testing.B) {
	benchL1Hit(b, linkcache.Entry{State: linkcache.Active, URL: "https://example.com/", Tenant: "t"}, benchHeader...)
}

// BenchmarkServeCodeL1HitRules is the hot path of a link with rules that
// do not match (every condition kind but country is tested) and variants:
// the visitor gets a variant.
func BenchmarkServeCodeL1HitRules(b *testing.B) {
	benchL1Hit(b, linkcache.Entry{State: linkcache.Active, URL: "https://example.com/", Tenant: "t", Rules: BenchRules(b)}, benchHeader...)
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
