// Package guessgate bounds the guesses of one key (a client address, an
// address and a link) that one process checks at once by the failures a
// limiter rule has left for it.
//
// The rules that bound guessing (the gateway's API keys and admin token,
// the redirect's link passwords) are looked at (cost 0) before a check and
// charged only after a failed one, so that right answers do not use them
// up. Unbounded, a burst of concurrent guesses all pass the look before the
// first failure is charged: 25-62 of 200 guesses were checked for a rule of
// 10. A Gate admits a check only while fewer checks of its key are in
// flight than its look saw failures left, and only if no check of the key
// failed since that look (else it looks again): even if every check in
// flight fails, no more fail than the rule allows, per process (a burst
// spread over n replicas at once may get up to n times as many). Checks of
// a key that is not failing run side by side, up to the rule's limit.
//
// A failure whose charge did not reach the limiter (its check timed out,
// or Redis did not answer) counts against what the looks see left while
// the key has checks alive: uncounted, the next look saw as many left as
// before, and 11-12 of a burst were checked for a rule of 10.
//
// A Gate holds only keys with a check alive, so its size is bounded by the
// requests in flight.
package guessgate

import (
	"context"
	"errors"
	"math"
	"sync"
)

// Unlimited is what a look returns when no rule bounds the key's failures.
const Unlimited = math.MaxInt64

// ErrSpent is Admit's error when the key's failures that the limiter did
// not count used up what its look saw left: refuse the guess (429) rather
// than wait for a check that will never end.
var ErrSpent = errors.New("guessgate: the failures left are used up")

// Gate is the checks in flight of every key on this process. The zero
// value is not usable: New.
type Gate struct {
	mu   sync.Mutex
	keys map[string]*checks
}

// checks is one key's checks on this process.
type checks struct {
	tickets  int   // alive: looking, waiting or checking
	inflight int   // admitted and not done
	failed   int64 // failures of its checks while tickets > 0
	// uncharged counts, of those, the failures the limiter did not count.
	uncharged int64
	freed     chan struct{} // closed, and replaced, when a check ends
}

// New returns an empty Gate.
func New() *Gate { return &Gate{keys: map[string]*checks{}} }

// Ticket is one admitted check of a key. End it with Fail or Done.
type Ticket struct {
	g        *Gate
	key      string
	st       *checks
	seen     int64 // st.failed at the last look
	admitted bool
	ended    bool
}

// Admit admits one check of key. look is called for each look at the rule
// (the limiter's peek, cost 0) and returns the failures the rule has left
// (Unlimited when no rule applies), or an error that refuses the check
// (Admit returns it as it is). Admit waits while the key's checks in
// flight use up what the look saw left, looks again when one of them
// failed meanwhile, and returns ErrSpent when the failures the limiter did
// not count used it up, or ctx's error when ctx ends first.
func (g *Gate) Admit(ctx context.Context, key string, look func() (int64, error)) (*Ticket, error) {
	t := g.begin(key)
	for {
		t.mark()
		left, err := look()
		var ok bool
		if err == nil {
			ok, err = t.await(ctx, left)
		}
		if err != nil {
			t.Done()
			return nil, err
		}
		if ok {
			return t, nil
		}
		// A check of the key failed since the look: look again.
	}
}

// Fail ends the check as a failed guess; charged says whether the limiter
// counted it (a decision on Redis).
func (t *Ticket) Fail(charged bool) { t.end(true, charged) }

// Done ends the check as anything but a failed guess. It does nothing
// after Fail, so it can be deferred.
func (t *Ticket) Done() { t.end(false, true) }

func (g *Gate) begin(key string) *Ticket {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.keys[key]
	if st == nil {
		st = &checks{freed: make(chan struct{})}
		g.keys[key] = st
	}
	st.tickets++
	return &Ticket{g: g, key: key, st: st}
}

// mark records that the rule is about to be looked at.
func (t *Ticket) mark() {
	t.g.mu.Lock()
	t.seen = t.st.failed
	t.g.mu.Unlock()
}

// admit admits the check if fewer than left are in flight (uncharged
// failures counting as in flight) and no check of the key failed since the
// look; stale says to look again; otherwise wait is closed when a check of
// the key ends, or is nil when none is in flight: the uncharged failures
// used up what was left.
func (t *Ticket) admit(left int64) (ok, stale bool, wait <-chan struct{}) {
	t.g.mu.Lock()
	defer t.g.mu.Unlock()
	if t.st.failed != t.seen {
		return false, true, nil
	}
	if int64(t.st.inflight)+t.st.uncharged < left {
		t.st.inflight++
		t.admitted = true
		return true, false, nil
	}
	if t.st.inflight == 0 {
		return false, false, nil
	}
	return false, false, t.st.freed
}

// await waits until the check is admitted with left failures (true), a
// check of the key failed since the look (false: look again), or ctx ends.
func (t *Ticket) await(ctx context.Context, left int64) (bool, error) {
	for {
		ok, stale, wait := t.admit(left)
		if ok || stale {
			return ok, nil
		}
		if wait == nil {
			return false, ErrSpent
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

func (t *Ticket) end(failed, charged bool) {
	t.g.mu.Lock()
	defer t.g.mu.Unlock()
	if t.ended {
		return
	}
	t.ended = true
	if t.admitted {
		t.st.inflight--
	}
	if failed {
		t.st.failed++
		if !charged {
			t.st.uncharged++
		}
	}
	close(t.st.freed)
	t.st.freed = make(chan struct{})
	if t.st.tickets--; t.st.tickets == 0 {
		delete(t.g.keys, t.key)
	}
}
