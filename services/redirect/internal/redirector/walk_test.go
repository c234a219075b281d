package redirector

import (
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func walkBound(t testing.TB, rate float64, burst int) *WalkBound {
	t.Helper()
	b, err := NewWalkBound(rate, burst)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestWalkBoundRefusesAnIPPastItsBurst: on a fixed clock, an IP gets burst
// distinct codes, then waits one interval for each more; a refused code
// asked again stays refused; another IP keeps its own burst.
func TestWalkBoundRefusesAnIPPastItsBurst(t *testing.T) {
	b := walkBound(t, 2, 10) // one lookup every 500 ms, 10 at once
	now := time.Unix(1_700_000_000, 0)
	for i := range 10 {
		if wait := b.Allow("203.0.113.1", "code"+strconv.Itoa(i), now); wait != 0 {
			t.Fatalf("lookup %d within the burst: wait %v", i+1, wait)
		}
	}
	if wait := b.Allow("203.0.113.1", "code10", now); wait != 500*time.Millisecond {
		t.Errorf("lookup past the burst: wait %v, want 500ms", wait)
	}
	if wait := b.Allow("203.0.113.1", "code10", now); wait == 0 {
		t.Error("the refused code, asked again, went through")
	}
	if wait := b.Allow("2001:db8::1", "code10", now); wait != 0 {
		t.Errorf("another IP: wait %v, want 0", wait)
	}
	later := now.Add(500 * time.Millisecond)
	if wait := b.Allow("203.0.113.1", "code10", later); wait != 0 {
		t.Errorf("one interval later: wait %v, want 0", wait)
	}
	if wait := b.Allow("203.0.113.1", "code11", later); wait != 500*time.Millisecond {
		t.Errorf("and the next: wait %v, want 500ms", wait)
	}
}

// TestWalkBoundNeverLimitsOneCodeAgain: the same code from the same IP,
// again and again, costs nothing even once the IP's burst is spent.
func TestWalkBoundNeverLimitsOneCodeAgain(t *testing.T) {
	b := walkBound(t, 0.001, 3)
	now := time.Unix(1_700_000_000, 0)
	for i := range 3 {
		b.Allow("198.51.100.1", "other"+strconv.Itoa(i), now)
	}
	if wait := b.Allow("198.51.100.2", "popular", now); wait != 0 {
		t.Fatalf("first click: wait %v", wait)
	}
	for i := range 10_000 {
		if wait := b.Allow("198.51.100.2", "popular", now); wait != 0 {
			t.Fatalf("click %d on the same code: wait %v, want 0", i+2, wait)
		}
	}
}

// TestWalkBoundCountsConcurrentLookups: 8 goroutines walking from one IP
// get through at least the burst and at most the burst plus one lookup per
// goroutine (a check and its charge are not one step); no charge is lost,
// so the rest is refused.
func TestWalkBoundCountsConcurrentLookups(t *testing.T) {
	const burst, workers, each = 100, 8, 200
	b := walkBound(t, 0.001, burst)
	now := time.Unix(1_700_000_000, 0)
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				if b.Allow("203.0.113.9", strconv.Itoa(w)+"-"+strconv.Itoa(i), now) == 0 {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := allowed.Load(); got < burst || got > burst+workers-1 {
		t.Errorf("%d of %d concurrent lookups allowed, want %d to %d", got, workers*each, burst, burst+workers-1)
	}
}

// TestWalkBoundAllocatesNothing: a lookup's check allocates nothing.
func TestWalkBoundAllocatesNothing(t *testing.T) {
	b := walkBound(t, 10, 1000)
	now := time.Now()
	codes := []string{"abc1234", "abc1235"}
	i := 0
	if n := testing.AllocsPerRun(1000, func() { i++; b.Allow("203.0.113.1", codes[i%2], now) }); n != 0 {
		t.Errorf("%v allocations per Allow, want 0", n)
	}
}

func TestCheckWalkBound(t *testing.T) {
	for _, tc := range []struct {
		rate  float64
		burst int
		ok    bool
	}{{10, 1000, true}, {0.001, 1, true}, {1e6, 1e6, true}, {0, 10, false}, {-1, 10, false},
		{10, 0, false}, {10, 1e6 + 1, false}, {0.0001, 10, false}, {1e7, 10, false}, {math.NaN(), 10, false}, {math.Inf(1), 10, false}} {
		if err := CheckWalkBound(tc.rate, tc.burst); (err == nil) != tc.ok {
			t.Errorf("CheckWalkBound(%v, %d) = %v, want ok %v", tc.rate, tc.burst, err, tc.ok)
		}
	}
}

// BenchmarkWalkBoundAllow is a lookup past L1 that counts: a code other
// than the IP's previous one, allowed (the budget is never spent).
func BenchmarkWalkBoundAllow(b *testing.B) {
	w := walkBound(b, 1e6, 1e6)
	now := time.Now()
	codes := []string{"abc1234", "abc1235"}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		if w.Allow("203.0.113.1", codes[i%2], now) != 0 {
			b.Fatal("refused")
		}
	}
}
