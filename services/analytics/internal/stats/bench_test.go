//go:build integration

package stats

import (
	"context"
	"fmt"
	"testing"
	"time"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/analytics/internal/clickstore"
	"kurz.dev/services/analytics/internal/useragent"
)

// The benchmark link: 1,000,000 clicks over the 30 days before benchEnd,
// in the database <KURZ_CLICKHOUSE_DATABASE>_bench so that no test sees
// them. They are loaded once and kept for later runs.
const (
	benchTenant = "bench"
	benchCode   = "bench1m"
	benchClicks = 1_000_000
	benchChunk  = 100_000
	// Two incidents leave suspect rows, as they do in production: a
	// consumer crash (5,000 consecutive clicks redelivered, 1,000 of them
	// stored twice) and an insert that failed mid-way (5,000 consecutive
	// clicks re-sent as suspect). The duplicate correction has real work.
	benchCrashAt, benchRetryAt, benchIncident = 300_000, 700_000, 5000
	benchDups                                 = 1000
)

var benchEnd = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

var benchUAs = []string{
	"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36",
	"Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1",
	"Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.6367.82 Mobile Safari/537.36",
	"Mozilla/5.0 (Macintosh; Intel Mac OS X 14.4; rv:125.0) Gecko/20100101 Firefox/125.0",
	"Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4_1) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4.1 Safari/605.1.15",
	"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36 Edg/124.0.2478.80",
	"Mozilla/5.0 (iPad; CPU OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1",
	"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
	"facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)",
}

// benchStore returns the store of the benchmark database, loading the
// benchmark link first if it is not complete.
func benchStore(b *testing.B) *clickstore.Store {
	b.Helper()
	var cfg struct{ ClickHouse chconn.Config }
	if err := config.LoadFrom(servertest.Env(nil), &cfg); err != nil {
		b.Fatal(err)
	}
	cfg.ClickHouse.Database += "_bench"
	ctx := context.Background()
	ch, err := chconn.New(ctx, cfg.ClickHouse)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ch.Close() })
	if err := clickstore.Apply(ctx, ch, clickstore.LayoutOf(cfg.ClickHouse)); err != nil {
		b.Fatal(err)
	}
	want := uint64(benchClicks + benchDups)
	var have uint64
	if err := ch.QueryRow(ctx, "SELECT count() FROM "+clickstore.EventsTable+" WHERE tenant = ? AND code = ?",
		benchTenant, benchCode).Scan(&have); err != nil {
		b.Fatal(err)
	}
	if have == want {
		return clickstore.New(ch, clickstore.LayoutOf(cfg.ClickHouse))
	}
	b.Logf("loading %d clicks into %s (found %d rows)", benchClicks, cfg.ClickHouse.Database, have)
	for _, t := range []string{clickstore.EventsTable, clickstore.HourlyTable, clickstore.DimsTable, clickstore.OwnersTable, clickstore.SuspectsTable} {
		if err := ch.Exec(ctx, "TRUNCATE TABLE IF EXISTS "+t); err != nil {
			b.Fatal(err)
		}
	}
	store := clickstore.New(ch, clickstore.LayoutOf(cfg.ClickHouse))
	start := time.Now()
	firstOfDay := make(map[string]bool)
	classes := make([]useragent.Class, len(benchUAs))
	for i, ua := range benchUAs {
		classes[i] = useragent.Classify(ua)
	}
	step := 30 * 24 * time.Hour / benchClicks
	chunk := make([]clickstore.Click, 0, benchChunk+benchDups)
	for i := range benchClicks {
		at := benchEnd.Add(-30 * 24 * time.Hour).Add(time.Duration(i) * step)
		day := at.Truncate(24 * time.Hour).Format(time.DateOnly)
		ua := (i * 7) % len(benchUAs)
		cl := classes[ua]
		c := clickstore.Click{
			Tenant: benchTenant, Code: benchCode, Time: at.Truncate(time.Second),
			EventID: fmt.Sprintf("bench-%07d", i), Visitor: fmt.Sprintf("%032x", (i*7919)%250_000),
			Referrer: fmt.Sprintf("https://site%d.example/page", (i*i)%97%60), UserAgent: benchUAs[ua],
			Browser: cl.Browser, OS: cl.OS, Device: cl.Device, Bot: cl.Bot,
			Flood: !cl.Bot && i%50 == 0,
		}
		crash := i >= benchCrashAt && i < benchCrashAt+benchIncident
		c.Suspect = crash || i >= benchRetryAt && i < benchRetryAt+benchIncident
		c.ReferrerHost = useragent.ReferrerHost(c.Referrer)
		if !c.Bot && !c.Flood && !firstOfDay[day+c.Visitor] {
			firstOfDay[day+c.Visitor] = true
			c.NewVisitor = true
		}
		if crash && i < benchCrashAt+benchDups {
			first := c // the crashed consumer's copy, received first-hand
			first.Suspect = false
			chunk = append(chunk, first)
		}
		chunk = append(chunk, c)
		if len(chunk) >= benchChunk || i == benchClicks-1 {
			if err := store.Insert(ctx, chunk); err != nil {
				b.Fatal(err)
			}
			chunk = chunk[:0]
		}
	}
	b.Logf("loaded in %s", time.Since(start).Round(time.Millisecond))
	return store
}

// BenchmarkGetLinkStats1M measures GetLinkStats for a link with 1,000,000
// stored clicks (10,000 suspect, 1,000 of them stored twice): the whole 30
// days by day, and the last 48 hours by hour.
//
//	KURZ_CLICKHOUSE_DATABASE=kurz_test go test -tags integration -run '^$' -bench GetLinkStats1M ./services/analytics/internal/stats/
func BenchmarkGetLinkStats1M(b *testing.B) {
	store := benchStore(b)
	svc := New(store, servertest.Logger(b), Options{})
	ctx := as(benchTenant)
	cases := map[string]*analyticsv1.GetLinkStatsRequest{
		"30d-daily": {Code: benchCode, StartTime: ts(benchEnd.Add(-30 * 24 * time.Hour)), EndTime: ts(benchEnd)},
		"48h-hourly": {Code: benchCode, StartTime: ts(benchEnd.Add(-48 * time.Hour)), EndTime: ts(benchEnd),
			Interval: analyticsv1.Interval_INTERVAL_HOUR},
	}
	resp, err := svc.GetLinkStats(ctx, cases["30d-daily"])
	if err != nil {
		b.Fatal(err)
	}
	if got := resp.GetCounts().GetTotal(); got != benchClicks {
		b.Fatalf("total %d, want %d", got, benchClicks)
	}
	b.Logf("30 days: %v; %d visitors; top referrer %v", resp.GetCounts(), resp.GetCounts().GetUniqueVisitors(), resp.GetTopReferrers()[0])
	for _, name := range []string{"30d-daily", "48h-hourly"} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := svc.GetLinkStats(ctx, cases[name]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
