package ratelimitfields

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The fields of one decision: the policy as an sf-string with q and w, the
// state with r and t (seconds rounded up); a denial has r=0 and t at least
// its retry-after; the older trio says the same with plain numbers.
func TestFields(t *testing.T) {
	long := strings.Repeat("d", 100) + "/" + strings.Repeat("r", 100)
	for name, tc := range map[string]struct {
		q                     Quota
		policy, state, legacy string
	}{
		"allowed": {Quota{Policy: "api/per-key", Limit: 60, Window: time.Minute, Remaining: 19, ResetAfter: 1100 * time.Millisecond, Allowed: true},
			`"api/per-key";q=60;w=60`, `"api/per-key";r=19;t=2`, "[[RateLimit-Limit 60] [RateLimit-Remaining 19] [RateLimit-Reset 2]]"},
		"denied": {Quota{Policy: "api/per-key", Limit: 60, Window: time.Minute, Remaining: 3, ResetAfter: 500 * time.Millisecond, RetryAfter: 2500 * time.Millisecond},
			`"api/per-key";q=60;w=60`, `"api/per-key";r=0;t=3`, "[[RateLimit-Limit 60] [RateLimit-Remaining 3] [RateLimit-Reset 1]]"},
		"no window, negative remaining": {Quota{Policy: "p", Limit: 10, Remaining: -1, Allowed: true},
			`"p";q=10`, `"p";r=0;t=0`, "[[RateLimit-Limit 10] [RateLimit-Remaining 0] [RateLimit-Reset 0]]"},
		"quoted name": {Quota{Policy: `we"ird\`, Limit: 1, Window: time.Second, Remaining: 1, Allowed: true},
			`"we\"ird\\";q=1;w=1`, `"we\"ird\\";r=1;t=0`, "[[RateLimit-Limit 1] [RateLimit-Remaining 1] [RateLimit-Reset 0]]"},
		"name past the stack buffer": {Quota{Policy: long, Limit: 1, Window: time.Second, Remaining: 1, Allowed: true},
			`"` + long + `";q=1;w=1`, `"` + long + `";r=1;t=0`, "[[RateLimit-Limit 1] [RateLimit-Remaining 1] [RateLimit-Reset 0]]"},
	} {
		t.Run(name, func(t *testing.T) {
			policy, state := Fields(tc.q)
			if policy != tc.policy || state != tc.state {
				t.Errorf("Fields: %q %q, want %q %q", policy, state, tc.policy, tc.state)
			}
			if got := fmt.Sprint(Legacy(tc.q)); got != tc.legacy {
				t.Errorf("Legacy: %s, want %s", got, tc.legacy)
			}
		})
	}
}

func TestCeilSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{-time.Second: 0, 0: 0, time.Nanosecond: 1, time.Second: 1, 1001 * time.Millisecond: 2} {
		if got := CeilSeconds(d); got != want {
			t.Errorf("CeilSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

func BenchmarkFields(b *testing.B) {
	q := Quota{Policy: "api/per-key", Limit: 60, Window: time.Minute, Remaining: 19, ResetAfter: 1100 * time.Millisecond, Allowed: true}
	b.ReportAllocs()
	for b.Loop() {
		Fields(q)
	}
}
