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
		if opened, _ := b.record(false, false, start, start.Add(timeout)); opened {
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
		if opened, _ = b.record(false, false, start, now); opened != (i == 1) {
			t.Fatalf("failure %d: opened=%v", i+2, opened)
		}
	}
	if got := b.state(now); got != breakerOpen {
		t.Fatalf("after 3 consecutive failures: state %v, want open", got)
	}

	// A success closes it and starts the count again.
	if _, closed := b.record(true, false, now, now.Add(time.Millisecond)); !closed {
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
	bs.get("gone:1").record(false, false, now, now)
	bs.get("gone:2")
	bs.get("kept:1").record(false, false, now, now)
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
	b.record(false, false, t0, t0)
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

// Each failed probe doubles the time the breaker stays open, up to the
// longest cooldown; failures of calls that were in flight when it opened
// neither extend it nor free the probe; a success closes it and the next
// opening is short again.
func TestBreakerCooldownGrowsWhileTheNodeStaysDown(t *testing.T) {
	b := &breaker{threshold: 1, cooldown: 100 * time.Millisecond, maxCooldown: time.Second}
	t0 := time.Unix(1000, 0)
	if opened, _ := b.record(false, false, t0, t0); !opened {
		t.Fatal("the first failure did not open a breaker of threshold 1")
	}
	now := t0
	for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		want *= time.Millisecond
		if b.state(now.Add(want-time.Millisecond)) != breakerOpen || b.state(now.Add(want)) != breakerHalfOpen {
			t.Fatalf("opening %d: want open for %v", i+1, want)
		}
		// A call that was in flight fails meanwhile: nothing changes.
		if b.record(false, false, t0, now.Add(want/2)); b.state(now.Add(want)) != breakerHalfOpen {
			t.Fatalf("opening %d: a straggler's failure changed the cooldown", i+1)
		}
		now = now.Add(want)
		if ok, probe := b.allow(now); !ok || !probe {
			t.Fatalf("opening %d: no probe after the cooldown", i+1)
		}
		if b.record(false, false, t0, now); !b.probing {
			t.Fatalf("opening %d: a straggler's failure freed the probe", i+1)
		}
		if opened, closed := b.record(false, true, now, now); opened || closed {
			t.Fatalf("opening %d: a failed probe reported opened=%v closed=%v", i+1, opened, closed)
		}
	}
	now = now.Add(time.Second)
	if ok, probe := b.allow(now); !ok || !probe {
		t.Fatal("no probe after the longest cooldown")
	}
	if _, closed := b.record(true, true, now, now); !closed {
		t.Fatal("a successful probe did not close the breaker")
	}
	if opened, _ := b.record(false, false, now.Add(time.Second), now.Add(time.Second)); !opened {
		t.Fatal("the next failure did not open the breaker again")
	}
	if got := b.state(now.Add(time.Second + 100*time.Millisecond)); got != breakerHalfOpen {
		t.Fatalf("after a close, the next opening: state %v at its first cooldown, want half-open", got)
	}
}

// Any answer closes the breaker, a straggler's too; the probe still out
// reports afterwards without reopening it.
func TestStragglerSuccessClosesWhileTheProbeIsOut(t *testing.T) {
	b := &breaker{threshold: 1, cooldown: 100 * time.Millisecond, maxCooldown: time.Second}
	t0 := time.Unix(1000, 0)
	b.record(false, false, t0, t0)
	half := t0.Add(100 * time.Millisecond)
	if ok, probe := b.allow(half); !ok || !probe {
		t.Fatal("no probe after the cooldown")
	}
	if _, closed := b.record(true, false, t0, half); !closed {
		t.Fatal("a straggler's success did not close the breaker")
	}
	if opened, closed := b.record(true, true, half, half); opened || closed || b.probing {
		t.Fatalf("the probe's success after the close: opened=%v closed=%v probing=%v, want no change", opened, closed, b.probing)
	}
	if got := b.state(half); got != breakerClosed {
		t.Fatalf("state %v, want closed", got)
	}
}

// A breaker forget dropped was counted closed then; a call that still held
// it reports no change, or the open-breakers gauge would be off for good.
func TestDroppedBreakerReportsNoChange(t *testing.T) {
	bs := &breakers{threshold: 1, cooldown: 100 * time.Millisecond, maxCooldown: time.Second, byNode: map[string]*breaker{}}
	t0 := time.Unix(1000, 0)
	wasOpen, wasClosed := bs.get("old:1"), bs.get("was-closed:1")
	if opened, _ := wasOpen.record(false, false, t0, t0); !opened {
		t.Fatal("threshold 1: the failure did not open the breaker")
	}
	half := t0.Add(time.Second)
	if ok, probe := wasOpen.allow(half); !ok || !probe {
		t.Fatal("no probe")
	}
	if n := bs.forget(func(string) bool { return false }); n != 1 {
		t.Fatalf("forget counted %d open breakers, want 1", n)
	}
	if opened, closed := wasOpen.record(true, true, half, half); opened || closed {
		t.Errorf("the dropped open breaker's probe succeeded: opened=%v closed=%v, want no change (forget counted it)", opened, closed)
	}
	if opened, closed := wasClosed.record(false, false, half, half); opened || closed {
		t.Errorf("a failure on a dropped closed breaker: opened=%v closed=%v, want no change (nothing would close it)", opened, closed)
	}
}

// Doubling stops at the longest cooldown whatever its size.
func TestBreakerCooldownDoesNotOverflow(t *testing.T) {
	const longest = time.Duration(1<<62 + 1)
	b := &breaker{threshold: 1, cooldown: longest / 2, maxCooldown: longest}
	t0 := time.Unix(0, 0)
	b.record(false, false, t0, t0)
	for i := range 3 {
		b.probing = true
		b.record(false, true, t0, t0)
		if b.openFor <= 0 || b.openFor > longest {
			t.Fatalf("failed probe %d: cooldown %v, want in (0, %v]", i+1, b.openFor, longest)
		}
	}
}
