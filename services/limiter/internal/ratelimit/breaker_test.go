package ratelimit

import (
	"testing"
	"time"
)

// Calls cut together by one stall are one failure; failures one after the
// other open the breaker at the threshold.
func TestBreakerCountsAStallOnce(t *testing.T) {
	b := &breaker{threshold: 3, cooldown: time.Second}
	t0 := time.Unix(1000, 0)
	timeout := 5 * time.Millisecond

	// 32 decisions in flight together, all cut at their deadline.
	for i := range 32 {
		start := t0.Add(time.Duration(i) * time.Microsecond)
		if opened, _ := b.record(false, start, start.Add(timeout)); opened {
			t.Fatalf("decision %d of one stall opened the breaker", i+1)
		}
	}
	if got := b.state(t0.Add(time.Second)); got != breakerClosed {
		t.Fatalf("after one stall: state %v, want closed", got)
	}

	// Two more failures, each of a call started after the last one was
	// seen: the third consecutive failure opens it.
	now := t0.Add(timeout + 32*time.Microsecond)
	var opened bool
	for i := range 2 {
		start := now.Add(time.Millisecond)
		now = start.Add(timeout)
		if opened, _ = b.record(false, start, now); opened != (i == 1) {
			t.Fatalf("failure %d: opened=%v", i+2, opened)
		}
	}
	if got := b.state(now); got != breakerOpen {
		t.Fatalf("after 3 consecutive failures: state %v, want open", got)
	}

	// A success closes it and starts the count again.
	if _, closed := b.record(true, now, now.Add(time.Millisecond)); !closed {
		t.Fatal("a success did not close the breaker")
	}
	if b.failures != 0 {
		t.Fatalf("failures %d after a success, want 0", b.failures)
	}
}

// A node that stops being a master (failover, removed from the cluster) gets
// no more calls, so its breaker would stay open for good: forget drops it
// and says it was open, and keeps the masters' breakers.
func TestForgetDropsBreakersOfFormerMasters(t *testing.T) {
	bs := &breakers{threshold: 1, cooldown: time.Minute, byNode: map[string]*breaker{}}
	now := time.Now()
	bs.get("gone:1").record(false, now, now)
	bs.get("gone:2")
	bs.get("kept:1").record(false, now, now)
	if got := bs.forget(func(n string) bool { return n == "kept:1" }); got != 1 {
		t.Errorf("forget = %d open breakers dropped, want 1 (gone:1)", got)
	}
	if _, ok := bs.byNode["gone:1"]; ok {
		t.Error("gone:1 still has a breaker")
	}
	if _, ok := bs.byNode["gone:2"]; ok {
		t.Error("gone:2 still has a breaker")
	}
	if b, ok := bs.byNode["kept:1"]; !ok || b.state(now) != breakerOpen {
		t.Error("the master's open breaker was dropped")
	}
}

// A half-open breaker lets one probe through; a probe whose caller gave up
// reports nothing about Redis, and the next call probes instead.
func TestAbandonedProbeFreesTheBreaker(t *testing.T) {
	b := &breaker{threshold: 1, cooldown: time.Second}
	t0 := time.Unix(1000, 0)
	b.record(false, t0, t0)
	half := t0.Add(2 * time.Second)
	if ok, probe := b.allow(half); !ok || !probe {
		t.Fatalf("half-open: allow = %v, probe = %v, want the probe", ok, probe)
	}
	if ok, _ := b.allow(half); ok {
		t.Fatal("a second call went through while the probe was out")
	}
	b.abandon()
	if ok, probe := b.allow(half); !ok || !probe {
		t.Fatalf("after the probe was abandoned: allow = %v, probe = %v, want a new probe", ok, probe)
	}
}
