package logging

import (
	"sync"
	"testing"
	"time"
)

// One line per period gets through, the first at once, and says how many
// were left out since the one before.
func TestEveryLetsOneLineThroughPerPeriod(t *testing.T) {
	now := time.Unix(1000, 0)
	e := &Every{Period: time.Second, Now: func() time.Time { return now }}
	if left, ok := e.Allow(); !ok || left != 0 {
		t.Fatalf("first line: ok %v, left out %d; want it logged, 0 left out", ok, left)
	}
	for i := range 5 {
		now = now.Add(100 * time.Millisecond)
		if _, ok := e.Allow(); ok {
			t.Fatalf("line %d within the period was let through", i+2)
		}
	}
	now = now.Add(500 * time.Millisecond) // a second after the first
	if left, ok := e.Allow(); !ok || left != 5 {
		t.Fatalf("line after the period: ok %v, left out %d; want it logged, 5 left out", ok, left)
	}
}

// Callers at once: exactly one is let through, and the count of the next
// line covers every other.
func TestEveryCountsEveryCallerAtOnce(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	e := &Every{Now: clock}
	var wg sync.WaitGroup
	var through sync.Map
	for i := range 64 {
		wg.Go(func() {
			if _, ok := e.Allow(); ok {
				through.Store(i, true)
			}
		})
	}
	wg.Wait()
	n := 0
	through.Range(func(any, any) bool { n++; return true })
	if n != 1 {
		t.Fatalf("%d of 64 callers at once let through, want 1", n)
	}
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	if left, ok := e.Allow(); !ok || left != 63 {
		t.Fatalf("next line: ok %v, left out %d; want it logged, 63 left out", ok, left)
	}
}
