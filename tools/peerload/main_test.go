package main

import (
	"math"
	"strings"
	"testing"
	"time"

	"kurz.dev/tools/loadgen"
)

func TestDecidedBy(t *testing.T) {
	m := &measurement{t: &target{redis: true}, sources: map[string]int64{"local_fallback": 1, "redis": 3}}
	if got, want := m.decidedBy(), "redis 75.0%, local_fallback 25.0%"; got != want {
		t.Errorf("decidedBy = %q, want %q", got, want)
	}
	if got := m.share("fail_open"); got != "0.0%" {
		t.Errorf("share of an absent source = %q", got)
	}
	// Without kurz's metrics: where the target keeps its counters.
	if got := (&measurement{t: &target{redis: true}}).decidedBy(); got != "Redis" {
		t.Errorf("decidedBy without sources = %q", got)
	}
	if got := (&measurement{t: &target{}}).decidedBy(); got != "memory" {
		t.Errorf("decidedBy in memory = %q", got)
	}
}

func TestTargetsSayMetOrMissed(t *testing.T) {
	envoy := &measurement{t: &target{name: "envoyproxy/ratelimit", redis: true}, shape: "spread"}
	gub := &measurement{t: &target{name: "gubernator"}, shape: "spread"}
	kurzSpread := &measurement{t: &target{name: "kurz", api: "ShouldRateLimit"}, shape: "spread", sources: map[string]int64{"redis": 10}}
	kurzSpreadQ := &measurement{t: &target{name: "kurz", api: "CheckQuota"}, shape: "spread", sources: map[string]int64{"redis": 9, "fail_open": 1}}
	kurzHot := &measurement{t: &target{name: "kurz", api: "ShouldRateLimit"}, shape: "hot"}
	vs := []versus{
		{kurz: kurzSpread, peer: envoy, throughput: 1.25, serverCPU: 0.5},
		{kurz: kurzSpreadQ, peer: gub, throughput: 1.0, serverCPU: nan},
		{kurz: kurzHot, peer: envoy, throughput: 1.6, serverCPU: 0.2},
	}
	var out strings.Builder
	targets(&out, vs, 100000)
	for _, want := range []string{
		"| 100000 keys: decisions/s, kurz ShouldRateLimit / envoyproxy/ratelimit ≥ 1.3× | 1.25 x | missed |",
		"| 100000 keys: decisions/s, kurz CheckQuota / gubernator ≥ 1.0× | 1.00 x | met |",
		"| one hot key: decisions/s, kurz ShouldRateLimit / envoyproxy/ratelimit ≥ 1.5× | 1.60 x | met |",
		"| 100000 keys: limiter CPU per decision, kurz ShouldRateLimit / envoyproxy/ratelimit ≤ 0.5× | 0.50 x | met |",
		"| 100000 keys: limiter CPU per decision, kurz CheckQuota / gubernator ≤ 0.5× | – | missed |",
		"| one hot key: limiter CPU per decision, kurz ShouldRateLimit / envoyproxy/ratelimit ≤ 0.5× | 0.20 x | met |",
		"| 100000 keys: every kurz ShouldRateLimit answer decided on Redis | 100.0% | met |",
		"| 100000 keys: every kurz CheckQuota answer decided on Redis | 90.0% | missed |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("targets lack %q:\n%s", want, out.String())
		}
	}
}

func TestNoRatioAgainstErrors(t *testing.T) {
	ok := &measurement{t: &target{name: "kurz", pid: 1}, rounds: []*loadgen.Result{{N: 100, Elapsed: time.Second}}, server: time.Millisecond}
	failing := &measurement{t: &target{name: "peer", pid: 2}, rounds: []*loadgen.Result{{N: 10, Errors: 5, Elapsed: time.Second}}, server: time.Millisecond}
	if v := compare(ok, failing, 0); !math.IsNaN(v.throughput) || !math.IsNaN(v.serverCPU) {
		t.Errorf("kurz vs a peer with errors: throughput %v, CPU %v; want no ratio", v.throughput, v.serverCPU)
	}
	if v := compare(ok, ok, 0); v.throughput != 1 || v.serverCPU != 1 {
		t.Errorf("kurz vs itself: throughput %v, CPU %v; want 1 and 1", v.throughput, v.serverCPU)
	}
}

func TestParseShapes(t *testing.T) {
	for in, want := range map[string]string{"hot,spread": "hot spread", "spread": "spread", " spread , hot": "spread hot"} {
		got, err := parseShapes(in)
		if err != nil || strings.Join(got, " ") != want {
			t.Errorf("parseShapes(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "warm", "hot,hot", "hot,,spread"} {
		if got, err := parseShapes(in); err == nil {
			t.Errorf("parseShapes(%q) = %q, want an error", in, got)
		}
	}
}
