package main

import "testing"

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
