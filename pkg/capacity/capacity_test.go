package capacity

import (
	"context"
	"errors"
	"testing"
	"time"
)

// take fills every slot of g and returns their releases.
func take(t *testing.T, g *Gate) []func() {
	t.Helper()
	var rels []func()
	for range g.Slots() {
		rel, err := g.Acquire(context.Background())
		if err != nil {
			t.Fatalf("Acquire of a free slot: %v", err)
		}
		rels = append(rels, rel)
	}
	return rels
}

// awaitWaiting polls until n callers wait on g.
func awaitWaiting(t *testing.T, g *Gate, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for g.waiting.Load() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d callers waiting, want %d", g.waiting.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestFullGateWithoutWaitRefuses(t *testing.T) {
	g := New(2, 0)
	rels := take(t, g)
	if _, err := g.Acquire(context.Background()); !errors.Is(err, ErrBusy) {
		t.Fatalf("Acquire on a full gate = %v, want ErrBusy", err)
	}
	rels[0]()
	rel, err := g.Acquire(context.Background())
	if err != nil {
		t.Fatalf("Acquire after a release = %v, want a slot", err)
	}
	rel()
	rels[1]()
}

func TestWaiterGetsReleasedSlot(t *testing.T) {
	g := New(1, time.Minute)
	rels := take(t, g)
	got := make(chan error, 1)
	go func() {
		rel, err := g.Acquire(context.Background())
		if err == nil {
			rel()
		}
		got <- err
	}()
	awaitWaiting(t, g, 1)
	rels[0]()
	if err := <-got; err != nil {
		t.Fatalf("waiting Acquire = %v, want the released slot", err)
	}
}

func TestWaitersBeyondSlotsAreRefusedAtOnce(t *testing.T) {
	g := New(1, time.Minute)
	rels := take(t, g)
	first := make(chan error, 1)
	go func() {
		rel, err := g.Acquire(context.Background())
		if err == nil {
			rel()
		}
		first <- err
	}()
	awaitWaiting(t, g, 1)
	// The slot is still taken: were this caller queued, it would block here
	// for the gate's minute.
	if _, err := g.Acquire(context.Background()); !errors.Is(err, ErrBusy) {
		t.Fatalf("Acquire with the wait queue full = %v, want ErrBusy", err)
	}
	rels[0]()
	if err := <-first; err != nil {
		t.Fatalf("queued Acquire = %v, want the released slot", err)
	}
}

func TestWaitRunsOut(t *testing.T) {
	g := New(1, time.Millisecond)
	rels := take(t, g)
	defer rels[0]()
	if _, err := g.Acquire(context.Background()); !errors.Is(err, ErrBusy) {
		t.Fatalf("Acquire past the wait = %v, want ErrBusy", err)
	}
	if n := g.waiting.Load(); n != 0 {
		t.Fatalf("%d callers still counted as waiting", n)
	}
}

func TestWaitEndsWithContext(t *testing.T) {
	g := New(1, time.Minute)
	rels := take(t, g)
	defer rels[0]()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.Acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled context = %v, want context.Canceled", err)
	}
}

func TestTryAcquireTakesOnlyAFreeSlotAndNeverWaits(t *testing.T) {
	g := New(2, time.Minute)
	tried, ok := g.TryAcquire()
	if !ok {
		t.Fatal("TryAcquire on an empty gate found no slot")
	}
	acquired, err := g.Acquire(context.Background())
	if err != nil {
		t.Fatalf("Acquire of the slot left: %v", err)
	}
	// Were TryAcquire to wait, it would block here for the gate's minute.
	if _, ok := g.TryAcquire(); ok {
		t.Fatal("TryAcquire on a full gate took a slot")
	}
	if n := g.waiting.Load(); n != 0 {
		t.Fatalf("TryAcquire counted %d callers as waiting, want 0", n)
	}
	tried()
	again, ok := g.TryAcquire()
	if !ok {
		t.Fatal("TryAcquire after a release found no slot")
	}
	again()
	acquired()
}
