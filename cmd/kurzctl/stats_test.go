package main

import (
	"strings"
	"testing"

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
