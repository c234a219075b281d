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
