package consumer

import (
	"context"
	"sync"
)

// pacer bounds a consumer's CheckQuotas calls in flight, over all its
// batches, to what the limiter decides on Redis. A limiter given more checks
// than its Redis answers within the limiter's deadline answers the rest by
// the rule's failure mode, which checks nothing: catching up on a backlog,
// four consumers at four calls each had 77% of their clicks unchecked. So
// the window grows by one call after each window's worth of calls decided
// on Redis, and halves after a call with any check that was not (additive
// increase, multiplicative decrease, as TCP shares a link): each consumer
// finds its share of what the limiter can decide, and a backlog drains no
// faster than its clicks can be checked.
type pacer struct {
	mu       sync.Mutex
	wake     chan struct{} // closed and replaced when a call ends
	window   float64       // calls allowed in flight, 1..max
	max      float64
	inflight int
}

func newPacer(max int) *pacer {
	return &pacer{wake: make(chan struct{}), window: 1, max: float64(max)}
}

// acquire waits until a call may start, or ctx is done.
func (p *pacer) acquire(ctx context.Context) error {
	for {
		p.mu.Lock()
		if float64(p.inflight) < p.window {
			p.inflight++
			p.mu.Unlock()
			return nil
		}
		wake := p.wake
		p.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// release ends a call; decided tells whether the limiter decided every
// check of it on Redis.
func (p *pacer) release(decided bool) {
	p.mu.Lock()
	p.inflight--
	if decided {
		p.window = min(p.max, p.window+1/p.window)
	} else {
		p.window = max(1, p.window/2)
	}
	close(p.wake)
	p.wake = make(chan struct{})
	p.mu.Unlock()
}

// size is the current window, for metrics and tests.
func (p *pacer) size() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.window
}
