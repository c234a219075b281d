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

// BenchmarkServeCodeL1Hit is the hot path: GET of a popular code that L1
// holds (a private Redis filled it once), answered 302 with no I/O. The
// handler routes by Host as in production (default hosts configured and
// 1,000 verified custom domains): "default" asks the default host, "custom"
// a custom domain's link (its key "<domain>/<code>"); "nohosts" is the
// handler without Host routing, as before custom domains.
func BenchmarkServeCodeL1Hit(b *testing.B) {
	rdb := benchRedis(b)
	hosts := NewHosts([]string{"kurz.test", "127.0.0.1"})
	domains := map[string]string{"go.acme.test": "t"}
	for i := range 999 {
		domains[fmt.Sprintf("go%d.example.test", i)] = "other"
	}
	hosts.SetDomains(domains)
	for _, c := range []struct {
		name  string
		hosts *Hosts
		host  string
	}{{"nohosts", nil, "kurz.test"}, {"default", hosts, "kurz.test"}, {"custom", hosts, "go.acme.test"}} {
		b.Run(c.name, func(b *testing.B) { benchL1Hit(b, rdb, benchConfig(), c.hosts, c.host) })
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
	benchL1Hit(b, benchRedis(b), cfg, nil, "kurz.test")
}

// benchRedis is a private Redis holding the popular link on the default
// domain and on go.acme.test.
func benchRedis(b *testing.B) redis.Cmdable {
	node := redistest.Start(b)
	rdb := redis.NewClient(&redis.Options{Addr: node.Addr})
	b.Cleanup(func() { _ = rdb.Close() })
	for _, key := range []string{"popular", "go.acme.test/popular"} {
		if err := linkcache.WriteThrough(context.Background(), rdb, key, linkcache.Entry{State: linkcache.Active, URL: "https://example.com/", Tenant: "t"}, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	return rdb
}

func benchL1Hit(b *testing.B, rdb redis.Cmdable, cfg Config, hosts *Hosts, host string) {
	log := slog.New(slog.DiscardHandler)
	meter := noop.NewMeterProvider().Meter("bench")
	res, err := resolve.New(resolve.Config{L1TTL: time.Hour, L1Size: 1000, RedisTimeout: time.Second, DBTimeout: time.Second}, rdb, nil, log, meter)
	if err != nil {
		b.Fatal(err)
	}
	h, err := New(cfg, Deps{Resolver: res, Clicks: discardClicks{}, Hosts: hosts, Log: log}, meter)
	if err != nil {
		b.Fatal(err)
	}
	mux := http.NewServeMux()
	h.Register(mux)
	req := httptest.NewRequest(http.MethodGet, "/popular", nil)
	req.Host = host + ":8787"
	req.RemoteAddr = "198.51.100.1:1234"
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
