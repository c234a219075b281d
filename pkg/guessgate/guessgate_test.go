package guessgate

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// begun starts a check of key and takes its look, as Admit does.
func begun(g *Gate, key string) *Ticket {
	t := g.begin(key)
	t.mark()
	return t
}

// Checks of one key run side by side up to the failures its look saw left;
// past that they wait; a failure sends the waiting ones back to look again;
// a key with nothing alive leaves the map.
func TestAdmitsUpToTheFailuresLeft(t *testing.T) {
	g := New()
	var admitted []*Ticket
	for i := range 3 {
		tk := begun(g, "192.0.2.1")
		if ok, stale, _ := tk.admit(3); !ok || stale {
			t.Fatalf("check %d of 3 left: ok=%v stale=%v; want admitted", i+1, ok, stale)
		}
		admitted = append(admitted, tk)
	}
	waiting := begun(g, "192.0.2.1")
	ok, stale, wait := waiting.admit(3)
	if ok || stale || wait == nil {
		t.Fatalf("a 4th check with 3 left: ok=%v stale=%v; want it waiting", ok, stale)
	}
	other := begun(g, "198.51.100.1")
	if ok, _, _ := other.admit(3); !ok {
		t.Error("another key's check waited for this one's")
	}
	other.Done()

	admitted[0].Done() // a success: the waiting one may go
	select {
	case <-wait:
	default:
		t.Fatal("a check ended and the waiting one was not woken")
	}
	if ok, stale, _ := waiting.admit(3); !ok || stale {
		t.Fatalf("after a success: ok=%v stale=%v; want admitted", ok, stale)
	}
	late := begun(g, "192.0.2.1")
	admitted[1].Fail(true) // a failure, charged: what late saw is stale
	if ok, stale, _ := late.admit(3); ok || !stale {
		t.Fatalf("after a failure since its look: ok=%v stale=%v; want told to look again", ok, stale)
	}
	admitted[1].Done() // after Fail: nothing
	for _, tk := range []*Ticket{admitted[2], waiting, late} {
		tk.Done()
	}
	if len(g.keys) != 0 {
		t.Errorf("%d keys left in the map with nothing alive", len(g.keys))
	}
}

// burst runs n concurrent Admits of one key whose looks all say left (the
// first looks held until all n have begun, as the requests of a burst
// are), fails every admitted check (charged or not) and counts the checks
// admitted and those refused with ErrSpent.
func burst(t *testing.T, n int, left int64, charged bool) (checked, spent int) {
	t.Helper()
	g := New()
	var arrived sync.WaitGroup
	arrived.Add(n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			first := true
			tk, err := g.Admit(t.Context(), "192.0.2.1", func() (int64, error) {
				if first {
					first = false
					arrived.Done()
					arrived.Wait()
				}
				return left, nil
			})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, ErrSpent):
				spent++
			case err != nil:
				t.Errorf("Admit: %v", err)
			default:
				checked++
				tk.Fail(charged)
			}
		})
	}
	wg.Wait()
	if len(g.keys) != 0 {
		t.Errorf("%d keys left in the map with nothing alive", len(g.keys))
	}
	return checked, spent
}

// Failures the limiter did not count (its check timed out) count here:
// with 3 left at every look (the limiter never saw a failure), a burst of
// 11 checks of one key that all fail, their charges lost, gets 3 checked,
// and the rest are told the failures are spent rather than left waiting.
func TestCountsFailuresTheLimiterMissed(t *testing.T) {
	const left, n = 3, 11
	if checked, spent := burst(t, n, left, false); checked != left || spent != n-left {
		t.Errorf("%d checked, %d refused of %d with %d left and every charge lost; want %d checked, %d refused", checked, spent, n, left, left, n-left)
	}
}

// A charged failure sends the waiting checks back to the limiter, whose
// next look says what is left: with a look that keeps saying 3 (a fake
// limiter that never counts), every check is admitted in turn, none
// refused here: the gate bounds what is in flight, the rule the total.
func TestChargedFailuresLeaveTheCountToTheLimiter(t *testing.T) {
	const n = 11
	if checked, spent := burst(t, n, 3, true); checked != n || spent != 0 {
		t.Errorf("%d checked, %d refused of %d, charges counted by the limiter; want all checked", checked, spent, n)
	}
}

// A look that refuses, or a context that ends while waiting, ends the
// ticket: the key leaves the map.
func TestRefusalsEndTheTicket(t *testing.T) {
	g := New()
	refused := errors.New("rule spent")
	if _, err := g.Admit(t.Context(), "k", func() (int64, error) { return 0, refused }); !errors.Is(err, refused) {
		t.Fatalf("a refusing look: %v, want its error", err)
	}
	holder, err := g.Admit(t.Context(), "k", func() (int64, error) { return 1, nil })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := g.Admit(ctx, "k", func() (int64, error) { return 1, nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("waiting with an ended context: %v, want context.Canceled", err)
	}
	holder.Done()
	if len(g.keys) != 0 {
		t.Errorf("%d keys left in the map with nothing alive", len(g.keys))
	}
	tk, err := g.Admit(t.Context(), "k", func() (int64, error) { return Unlimited, nil })
	if err != nil {
		t.Fatalf("no rule: %v", err)
	}
	tk.Done()
}
