package main

import (
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
)

// stats shows the countries of a link's clicks, "(unknown)" for those the
// redirect could not locate, and no country table at all when no click
// has a country (a redirect without a GeoIP database).
func TestPrintStatsCountries(t *testing.T) {
	stats := func(countries ...*analyticsv1.KeyCount) string {
		var b strings.Builder
		if err := printStats(&b, &analyticsv1.GetLinkStatsResponse{
			Code: "abc1234", Counts: &analyticsv1.ClickCounts{Total: 5, Human: 5}, TopCountries: countries,
		}); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	out := stats(&analyticsv1.KeyCount{Key: "DE", Count: 3}, &analyticsv1.KeyCount{Key: "", Count: 2})
	for _, want := range []string{"COUNTRY    CLICKS\n", "DE         3\n", "(unknown)  2\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("stats output lacks %q:\n%s", want, out)
		}
	}
	if out := stats(&analyticsv1.KeyCount{Key: "", Count: 5}); strings.Contains(out, "COUNTRY") {
		t.Errorf("stats without a known country shows a country table:\n%s", out)
	}
}

// A bucket's bars never outgrow the chart, whatever the counts say: a
// human count far above the bucket's total (the busiest total sets the
// scale) draws width cells, not millions, and a negative count draws
// nothing rather than panicking.
func TestChartClampsBarsToItsWidth(t *testing.T) {
	const width = 40
	day := timestamppb.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	for name, counts := range map[string]*analyticsv1.ClickCounts{
		"human above total": {Total: 1, Human: 5_000_000},
		"bots above total":  {Total: 1, Human: 1, Bot: 5_000_000},
		"both above total":  {Total: 1, Human: 5_000_000, Bot: 3, Flood: 4},
		"negative human":    {Total: 1, Human: -1},
		"negative bots":     {Total: 1, Human: 1, Bot: -7},
		"overflowing bots":  {Total: 1, Bot: math.MaxInt64, Flood: 1},
	} {
		t.Run(name, func(t *testing.T) {
			out := chart([]*analyticsv1.TimeBucket{{StartTime: day, Counts: counts}}, analyticsv1.Interval_INTERVAL_DAY, width)
			bar := strings.TrimRight(strings.SplitN(strings.TrimPrefix(out, "2026-01-01  "), "  ", 2)[0], " ")
			if n := cells(bar); n > width+1 {
				t.Errorf("bar of %d cells, want at most %d:\n%s", n, width+1, out)
			}
			if counts.GetHuman() < 0 && strings.Contains(bar, "█") || counts.GetBot() < 0 && strings.Contains(bar, "░") {
				t.Errorf("a negative count drew a bar: %q", bar)
			}
		})
	}
}
