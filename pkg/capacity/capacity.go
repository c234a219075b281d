// Package capacity bounds how much of one costly kind of work a process does
// at once (password hashing in the shortener, bulk requests in the gateway):
// a fixed number of slots, a short bounded wait for one, and ErrBusy past
// it. Overload is refused at once, with a reason a caller can retry on,
// instead of being queued until memory runs out.
package capacity

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// ErrBusy reports that every slot stayed taken for the whole wait, or that
// too many callers were already waiting.
var ErrBusy = errors.New("capacity: every slot is busy")

// Gate hands out a fixed number of slots. At most as many callers wait as
// there are slots (a caller that would wait longer than one round of the
// work is better told to come back), each for at most the gate's wait.
// Waiters are served in arrival order. The zero Gate is not usable: use New.
type Gate struct {
	slots   chan struct{}
	wait    time.Duration
	waiting atomic.Int64
}

// New returns a gate of n slots (at least 1) whose callers wait at most wait
// (0: never) for one.
func New(n int, wait time.Duration) *Gate {
	return &Gate{slots: make(chan struct{}, max(n, 1)), wait: max(wait, 0)}
}

// Slots is the number of slots.
func (g *Gate) Slots() int { return cap(g.slots) }

// Acquire takes a slot, waiting at most the gate's wait and never past ctx.
// On success the caller must call release exactly once when the work is
// done. It fails with ErrBusy, or ctx's error if ctx ends first.
func (g *Gate) Acquire(ctx context.Context) (release func(), err error) {
	release = func() { <-g.slots }
	select {
	case g.slots <- struct{}{}:
		return release, nil
	default:
	}
	if g.wait == 0 {
		return nil, ErrBusy
	}
	if g.waiting.Add(1) > int64(cap(g.slots)) {
		g.waiting.Add(-1)
		return nil, ErrBusy
	}
	defer g.waiting.Add(-1)
	t := time.NewTimer(g.wait)
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
		return release, nil
	case <-t.C:
		return nil, ErrBusy
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TryAcquire takes a slot if one is free now, without waiting and without
// counting as a waiter: for a caller that holds a slot already and would
// only go faster with another. A slot released while callers wait goes to
// the first of them, never to TryAcquire. On success the caller must call
// release exactly once when the work is done.
func (g *Gate) TryAcquire() (release func(), ok bool) {
	select {
	case g.slots <- struct{}{}:
		return func() { <-g.slots }, true
	default:
		return nil, false
	}
}
