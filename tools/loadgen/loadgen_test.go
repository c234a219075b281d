package loadgen

import (
	"errors"
	"testing"
	"time"
)

func TestOpenLoopCountsFromTheSchedule(t *testing.T) {
	// One worker, a call that stalls once for 100 ms: the calls scheduled
	// behind it wait, and their latency must show it.
	calls := 0
	r := Open("stall", 200, 1, 250*time.Millisecond, func(int) (string, error) {
		calls++
		if calls == 1 {
			time.Sleep(100 * time.Millisecond)
			return "slow", nil
		}
		return "fast", nil
	})
	if r.N != 50 || r.Errors != 0 || r.Tags["slow"] != 1 || r.Tags["fast"] != 49 {
		t.Fatalf("n %d errors %d tags %v, want 50 calls, no error, tags slow 1 fast 49", r.N, r.Errors, r.Tags)
	}
	// About 20 calls were due during the stall, waiting up to 95 ms; a
	// closed-loop measurement would report all but the first as fast.
	if got := r.Quantile(0.9); got < 40*time.Millisecond {
		t.Errorf("90th percentile %v: the stall is hidden (coordinated omission)", got)
	}
}

func TestClosedLoopRunsForTheDuration(t *testing.T) {
	r := Closed("busy", 2, 50*time.Millisecond, func(int) (string, error) {
		time.Sleep(time.Millisecond)
		return "", nil
	})
	if r.N == 0 || r.Elapsed < 50*time.Millisecond || len(r.Tags) != 0 {
		t.Errorf("n %d elapsed %v tags %v", r.N, r.Elapsed, r.Tags)
	}
}

// A call that fails counts as an error only: not in the rate, the
// percentiles nor the tags, so a target failing fast does not look fast.
func TestErrorsAreNeitherThroughputNorLatency(t *testing.T) {
	calls := 0
	r := Open("half fail", 200, 1, 250*time.Millisecond, func(int) (string, error) {
		calls++
		if calls%2 == 0 {
			return "failed", errors.New("refused")
		}
		time.Sleep(2 * time.Millisecond)
		return "ok", nil
	})
	if r.N != 25 || r.Errors != 25 || r.Tags["ok"] != 25 || r.Tags["failed"] != 0 {
		t.Fatalf("n %d errors %d tags %v, want 25 answered, 25 errors, tags ok 25", r.N, r.Errors, r.Tags)
	}
	if got := r.Quantile(0); got < 2*time.Millisecond {
		t.Errorf("fastest latency %v: a failed call (instant) was counted", got)
	}
}
