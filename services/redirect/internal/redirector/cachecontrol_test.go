package redirector

import (
	"slices"
	"testing"
	"time"
)

// TestCacheableRedirectEndsWithItsLink: a cacheable redirect's max-age is
// the configured one, or the whole seconds left before its link expires
// when that is less, so no cache keeps it past the expiry; under a second
// left it is no-store. A link that never expires, or outlives the max-age,
// gets the shared configured value itself, without allocating.
func TestCacheableRedirectEndsWithItsLink(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	clock := func() time.Time { return now }
	at := func(d time.Duration) int64 { return now.Add(d).UnixMilli() }
	hour := []string{"public, max-age=3600"}
	for _, tc := range []struct {
		name      string
		cc        []string
		scope     string
		maxAge    time.Duration
		expiresAt int64
		want      string
		shared    bool
	}{
		{"never expires", hour, "public", time.Hour, 0, "public, max-age=3600", true},
		{"expires after the max-age", hour, "public", time.Hour, at(2 * time.Hour), "public, max-age=3600", true},
		{"expires exactly at the max-age", hour, "public", time.Hour, at(time.Hour), "public, max-age=3600", true},
		{"expires in 30.9 s", hour, "public", time.Hour, at(30*time.Second + 900*time.Millisecond), "public, max-age=30", false},
		{"private, expires in 59 min", []string{"private, max-age=3600"}, "private", time.Hour, at(59 * time.Minute), "private, max-age=3540", false},
		{"CDN max-age, expires in 2 s", []string{"public, max-age=5"}, "public", 5 * time.Second, at(2 * time.Second), "public, max-age=2", false},
		{"expires in 1 s", hour, "public", time.Hour, at(time.Second), "public, max-age=1", false},
		{"expires in 999 ms", hour, "public", time.Hour, at(999 * time.Millisecond), "no-store", false},
		{"expires now", hour, "public", time.Hour, at(0), "no-store", false},
		{"expired", hour, "public", time.Hour, at(-time.Minute), "no-store", false},
		{"configured max-age 0", []string{"public, max-age=0"}, "public", 0, at(500 * time.Millisecond), "public, max-age=0", true},
	} {
		got := untilExpiry(tc.cc, tc.scope, tc.maxAge, tc.expiresAt, clock)
		if !slices.Equal(got, []string{tc.want}) {
			t.Errorf("%s: Cache-Control %q, want %q", tc.name, got, tc.want)
		}
		if shared := len(got) > 0 && &got[0] == &tc.cc[0]; shared != tc.shared {
			t.Errorf("%s: the configured value itself %v, want %v", tc.name, shared, tc.shared)
		}
	}
	if n := testing.AllocsPerRun(100, func() { untilExpiry(hour, "public", time.Hour, 0, clock) }); n != 0 {
		t.Errorf("a link that never expires: %v allocations, want 0", n)
	}
}
