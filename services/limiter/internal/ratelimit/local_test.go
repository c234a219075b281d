package ratelimit

import (
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

// localRules has a rule of each algorithm, 10 per second (the buckets with
// a burst of 20), in failure mode local.
const localRules = `
domains:
  l:
    rules:
      - {name: token_bucket, key: [user], match: {algo: token_bucket}, algorithm: token_bucket, limit: 10, window: 1s, burst: 20, failure_mode: local}
      - {name: leaky_bucket, key: [user], match: {algo: leaky_bucket}, algorithm: leaky_bucket, limit: 10, window: 1s, burst: 20, failure_mode: local}
      - {name: fixed_window, key: [user], match: {algo: fixed_window}, algorithm: fixed_window, limit: 10, window: 1s, failure_mode: local}
      - {name: sliding_window_counter, key: [user], match: {algo: sliding_window_counter}, algorithm: sliding_window_counter, limit: 10, window: 1s, failure_mode: local}
      - {name: sliding_log, key: [user], match: {algo: sliding_log}, algorithm: sliding_log, limit: 10, window: 1s, failure_mode: local}
`

// localAlgos are the algorithms, as localRules names their rules.
var localAlgos = []string{"token_bucket", "leaky_bucket", "fixed_window", "sliding_window_counter", "sliding_log"}

// localRuleOf returns the rule of algo in src's domain "l".
func localRuleOf(t *testing.T, src, algo string) *Rule {
	t.Helper()
	_, applied := compile(t, src).Match("l", map[string]string{"user": "u", "algo": algo})
	if len(applied) != 1 {
		t.Fatalf("%s: %d rules match, want 1", algo, len(applied))
	}
	return applied[0].Rule
}

func newLocal(t *testing.T, replicas int) *localLimiter {
	t.Helper()
	l, err := newLocalLimiter(StaticFleet(replicas), 100)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// localEpoch is an instant off every window's boundary, so windows
// counted from the epoch do not line up with the trace.
var localEpoch = time.Date(2030, 1, 1, 0, 0, 0, 123_456_789, time.UTC)

// localTrace runs five seconds of requests of cost 1 through l: one every
// 3 ms and bursts of 40 at 0, 0.999 s, 1.001 s, 2.5 s and 4.2 s (a fixed
// window's boundary, for windows starting at 0). It returns the instants
// admitted.
func localTrace(l *localLimiter, r *Rule) []time.Time {
	bursts := map[time.Duration]bool{0: true, 999 * time.Millisecond: true, 1001 * time.Millisecond: true, 2500 * time.Millisecond: true, 4200 * time.Millisecond: true}
	var admitted []time.Time
	for at := time.Duration(0); at < 5*time.Second; at += time.Millisecond {
		n := 0
		switch {
		case bursts[at]:
			n = 40
		case at%(3*time.Millisecond) == 0:
			n = 1
		}
		now := localEpoch.Add(at)
		for range n {
			if l.take("k", r, 1, now).allowed {
				admitted = append(admitted, now)
			}
		}
	}
	return admitted
}

// mostWithin is the most instants of ts (in order) within any closed
// interval of length d.
func mostWithin(ts []time.Time, d time.Duration) int {
	most, j := 0, 0
	for i := range ts {
		for j < len(ts) && ts[j].Sub(ts[i]) <= d {
			j++
		}
		most = max(most, j-i)
	}
	return most
}

// A replica in local fallback admits at most its share, 1/n of the rule
// rounded down, so the n replicas together never admit more than Redis
// would: for the window algorithms at most floor(limit/n) in any interval
// of one window, wherever it starts (a token bucket of limit/n with a burst
// admitted about twice that); for the buckets at most floor(burst/n) plus
// limit/n per window, over any window. It still admits: every window
// algorithm hands out its share about once a window.
func TestLocalFallbackStaysWithinTheShare(t *testing.T) {
	for _, algo := range localAlgos {
		for _, replicas := range []int{1, 2, 3} {
			t.Run(fmt.Sprintf("%s/%d_replicas", algo, replicas), func(t *testing.T) {
				r := localRuleOf(t, localRules, algo)
				admitted := localTrace(newLocal(t, replicas), r)
				got := mostWithin(admitted, r.Window)
				n := float64(replicas)
				share := math.Floor(float64(r.Limit) / n)
				if strings.HasSuffix(algo, "_bucket") {
					share = math.Floor(math.Floor(float64(r.Burst)/n) + float64(r.Limit)/n)
				}
				if got > int(share) {
					t.Errorf("admitted %d within one window (%d in 5 s), want at most %v", got, len(admitted), share)
				}
				if least := 4 * int(math.Floor(float64(r.Limit)/n)); len(admitted) < least {
					t.Errorf("admitted %d in 5 windows, want at least %d", len(admitted), least)
				}
			})
		}
	}
}

// A rule whose capacity is less than the replica count has a share below
// one unit on every replica: it is denied locally, for the whole window,
// rather than rounded up to one unit a replica (3 replicas, 1 per hour:
// 3 an hour).
func TestLocalFallbackShareBelowOneUnitDenies(t *testing.T) {
	const rules = `
domains:
  l:
    rules:
      - {name: token_bucket, key: [user], match: {algo: token_bucket}, algorithm: token_bucket, limit: 2, window: 1h, failure_mode: local}
      - {name: leaky_bucket, key: [user], match: {algo: leaky_bucket}, algorithm: leaky_bucket, limit: 100, window: 1h, burst: 2, failure_mode: local}
      - {name: fixed_window, key: [user], match: {algo: fixed_window}, algorithm: fixed_window, limit: 1, window: 1h, failure_mode: local}
      - {name: sliding_window_counter, key: [user], match: {algo: sliding_window_counter}, algorithm: sliding_window_counter, limit: 2, window: 1h, failure_mode: local}
      - {name: sliding_log, key: [user], match: {algo: sliding_log}, algorithm: sliding_log, limit: 2, window: 1h, failure_mode: local}
`
	for _, algo := range localAlgos {
		t.Run(algo, func(t *testing.T) {
			r := localRuleOf(t, rules, algo)
			admitted := 0
			for replica := range 3 {
				l := newLocal(t, 3)
				for i := range 5 {
					res := l.take("k", r, 1, localEpoch.Add(time.Duration(i)*time.Minute))
					if res.allowed {
						admitted++
						continue
					}
					if res.limit != 0 || res.retryAfter != r.Window {
						t.Errorf("replica %d, try %d: limit %d, retry after %v; want 0 and the window, %v", replica, i, res.limit, res.retryAfter, r.Window)
					}
				}
			}
			if admitted != 0 {
				t.Errorf("3 replicas admitted %d for a capacity of 2 or less, want 0", admitted)
			}
		})
	}
}

// A window algorithm's denial says when the share has room again: the
// oldest units leave a window (and at most a slot) after they were
// admitted, not a moment before.
func TestLocalWindowRetryAfter(t *testing.T) {
	r := localRuleOf(t, localRules, "sliding_log")
	l := newLocal(t, 1)
	for i := range 10 {
		if res := l.take("k", r, 1, localEpoch.Add(time.Duration(i)*time.Millisecond)); !res.allowed {
			t.Fatalf("unit %d of 10 denied", i+1)
		}
	}
	now := localEpoch.Add(500 * time.Millisecond)
	res := l.take("k", r, 1, now)
	if res.allowed || res.remaining != 0 {
		t.Fatalf("11th unit: allowed=%v remaining=%d, want denied, 0", res.allowed, res.remaining)
	}
	if res.retryAfter < 500*time.Millisecond || res.retryAfter > 500*time.Millisecond+r.Window/localSlots {
		t.Errorf("retry after %v, want 500ms to %v", res.retryAfter, 500*time.Millisecond+r.Window/localSlots)
	}
	if l.take("k", r, 1, now.Add(res.retryAfter-time.Nanosecond)).allowed {
		t.Errorf("allowed before the retry-after")
	}
	if !l.take("k", r, 1, now.Add(res.retryAfter)).allowed {
		t.Errorf("denied at the retry-after")
	}
}

// A refund (another rule denied the request) gives the units back at
// once, and never more than the share holds.
func TestLocalRefund(t *testing.T) {
	for _, algo := range localAlgos {
		t.Run(algo, func(t *testing.T) {
			r := localRuleOf(t, localRules, algo)
			l := newLocal(t, 1)
			capacity := int(r.capacity())
			for i := range capacity {
				if !l.take("k", r, 1, localEpoch).allowed {
					t.Fatalf("unit %d of %d denied", i+1, capacity)
				}
			}
			admitted := func() int {
				n := 0
				for range 2 * capacity {
					if l.take("k", r, 1, localEpoch).allowed {
						n++
					}
				}
				return n
			}
			l.refund("k", r, 4)
			if got := admitted(); got != 4 {
				t.Errorf("after a refund of 4 units: admitted %d, want 4", got)
			}
			l.refund("k", r, int64(capacity)+5)
			if got := admitted(); got != capacity {
				t.Errorf("after a refund of %d units, %d of them never taken: admitted %d, want %d", capacity+5, 5, got, capacity)
			}
		})
	}
}

// A key whose state the full cache dropped does not come back with its
// share afresh: a key met without state within a window of an eviction
// starts spent (stricter, never looser); a window later keys start fresh.
func TestLocalFallbackEvictionDoesNotResetAShare(t *testing.T) {
	for _, algo := range localAlgos {
		t.Run(algo, func(t *testing.T) {
			r := localRuleOf(t, localRules, algo)
			l, err := newLocalLimiter(StaticFleet(1), 4)
			if err != nil {
				t.Fatal(err)
			}
			now := localEpoch
			admitted := func(key string, n int) int {
				ok := 0
				for range n {
					if l.take(key, r, 1, now).allowed {
						ok++
					}
				}
				return ok
			}
			share := admitted("victim", 100)
			if share == 0 {
				t.Fatal("the victim got nothing")
			}
			for i := range 4 { // the fourth evicts the victim
				admitted(fmt.Sprintf("flood-%d", i), 1)
			}
			if _, kept := l.keys.Peek("victim"); kept {
				t.Fatal("the victim is still cached")
			}
			if got := admitted("victim", 100); got != 0 {
				t.Errorf("the evicted victim was admitted %d more after its share of %d", got, share)
			}
			now = now.Add(l.memory(r) + time.Millisecond)
			if got := admitted("newcomer", 1); got != 1 {
				t.Errorf("a new key a window after the last eviction: admitted %d, want 1", got)
			}
		})
	}
}

// A look (cost 0) at a local rule while Redis is down reports the key's
// local state as a take would see it, and consumes nothing: it used to
// report the whole limit remaining and no reset, however much of the
// replica's share was spent.
func TestLocalLookReportsTheShareWithoutConsuming(t *testing.T) {
	m, err := newEngineMetrics(noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	for _, algo := range localAlgos {
		t.Run(algo, func(t *testing.T) {
			e := &Engine{local: newLocal(t, 2), m: m, log: slog.New(slog.DiscardHandler)}
			_, rules := compile(t, localRules).Match("l", map[string]string{"user": "u", "algo": algo})
			decide := func(cost int64) result {
				results := make([]result, 1)
				e.fallback(&group{idx: []int{0}, keys: []string{rules[0].Key}}, rules, results, cost, localEpoch)
				return results[0]
			}
			var last result
			for range 3 {
				last = decide(1)
			}
			for i := range 2 {
				look := decide(0)
				if !look.allowed || look.remaining != last.remaining || look.resetAfter != last.resetAfter || look.limit != last.limit {
					t.Errorf("look %d after 3 units: allowed %v, remaining %d of %d, reset %v; want allowed, %d of %d, %v (the third take's)",
						i+1, look.allowed, look.remaining, look.limit, look.resetAfter, last.remaining, last.limit, last.resetAfter)
				}
				if look.source != ratelimitv1.DecisionSource_DECISION_SOURCE_LOCAL_FALLBACK {
					t.Errorf("look %d: source %v, want LOCAL_FALLBACK", i+1, look.source)
				}
			}
			if got := decide(1); got.remaining != last.remaining-1 {
				t.Errorf("a take after two looks: %d remaining, want %d (the looks consumed)", got.remaining, last.remaining-1)
			}
			// A look at a key the fallback does not track tracks none.
			tracked := e.local.keys.Len()
			_, fresh := compile(t, localRules).Match("l", map[string]string{"user": "fresh", "algo": algo})
			results := make([]result, 1)
			e.fallback(&group{idx: []int{0}, keys: []string{fresh[0].Key}}, fresh, results, 0, localEpoch)
			if got := results[0]; !got.allowed || got.remaining != got.limit || got.resetAfter != 0 || e.local.keys.Len() != tracked {
				t.Errorf("a look at a fresh key: allowed %v, remaining %d of %d, reset %v, keys tracked %d (was %d); want allowed, full, 0, unchanged",
					got.allowed, got.remaining, got.limit, got.resetAfter, e.local.keys.Len(), tracked)
			}
		})
	}
}

// A check-only rule (an Envoy descriptor's hits_addend 0) decided by the
// local fallback reports the share as a look does and consumes nothing,
// and denies once the share has not one unit left.
func TestLocalCheckOnlyConsumesNothingAndDeniesWhenSpent(t *testing.T) {
	m, err := newEngineMetrics(noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	for _, algo := range localAlgos {
		t.Run(algo, func(t *testing.T) {
			e := &Engine{local: newLocal(t, 2), m: m, log: slog.New(slog.DiscardHandler)}
			_, rules := compile(t, localRules).Match("l", map[string]string{"user": "u", "algo": algo})
			checks := []Applied{rules[0]}
			checks[0].checkOnly = true
			decide := func(rules []Applied) result {
				results := make([]result, 1)
				e.fallback(&group{idx: []int{0}, keys: []string{rules[0].Key}}, rules, results, 1, localEpoch)
				return results[0]
			}
			var last result
			for range 3 {
				last = decide(rules)
			}
			for i := range 2 {
				if got := decide(checks); !got.allowed || got.remaining != last.remaining {
					t.Errorf("check %d after 3 units: allowed %v, remaining %d; want allowed, %d", i+1, got.allowed, got.remaining, last.remaining)
				}
			}
			if got := decide(rules); got.remaining != last.remaining-1 {
				t.Errorf("a take after two checks: %d remaining, want %d (the checks consumed)", got.remaining, last.remaining-1)
			}
			for range 100 {
				if !decide(rules).allowed {
					break
				}
			}
			if got := decide(checks); got.allowed || got.retryAfter <= 0 {
				t.Errorf("check of a spent share: allowed %v, retry after %v; want denied, a retry-after", got.allowed, got.retryAfter)
			}
		})
	}
}
