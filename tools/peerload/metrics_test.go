package main

import (
	"maps"
	"strings"
	"testing"
)

func TestParseDecisions(t *testing.T) {
	const text = `# HELP kurz_ratelimit_decisions_total Rule decisions by domain, rule, outcome and how they were served
# TYPE kurz_ratelimit_decisions_total counter
kurz_ratelimit_decisions_total{domain="demo",otel_scope_name="kurz.dev/services/limiter",outcome="allowed",rule="fixed_window",source="redis"} 1.2e+06
kurz_ratelimit_decisions_total{domain="demo",otel_scope_name="kurz.dev/services/limiter",outcome="denied",rule="fixed_window",source="redis"} 30
kurz_ratelimit_decisions_total{domain="demo",otel_scope_name="kurz.dev/services/limiter",outcome="allowed",rule="fixed_window",source="local_fallback"} 7
kurz_ratelimit_decisions_total{domain="demo",otel_scope_name="kurz.dev/services/limiter",outcome="allowed",rule="token_bucket",source="redis"} 5
kurz_ratelimit_decisions_total{domain="demo.race",otel_scope_name="kurz.dev/services/limiter",outcome="allowed",rule="fixed_window",source="redis"} 9
kurz_ratelimit_decisions_total_other{domain="demo",rule="fixed_window",source="redis"} 100
kurz_ratelimit_fallbacks_total{rule="fixed_window",source="local_fallback"} 7
`
	got, err := parseDecisions(strings.NewReader(text), "demo", "fixed_window")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int64{"redis": 1_200_030, "local_fallback": 7}; !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if _, err := parseDecisions(strings.NewReader(`kurz_ratelimit_decisions_total{domain="demo",rule="fixed_window",source="redis"} x`+"\n"), "demo", "fixed_window"); err == nil {
		t.Error("bad value: no error")
	}
}
