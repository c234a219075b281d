package httpapi

import (
	"context"
	"errors"
	"sync"
)

// authSlots bounds the credential checks of one client address in flight
// on this gateway to the failures the brute-force rule has left for it.
// The rule is looked at (cost 0) before a check and charged only after a
// failed one: unbounded, a burst of concurrent guesses all passed the look
// before any failure was counted (25-62 of 200 guesses checked, for a rule
// of 10). A check is admitted only while fewer checks are in flight than
// its look saw failures left, and only if no check of the address failed
// since that look (else it looks again): so even if every check in flight
// fails, no more fail than the rule allows (per gateway replica: a burst
// spread over n replicas at once may get up to n times as many). Checks of
// an address that is not failing run side by side, up to the rule's limit
// at once; while the limiter cannot tell what is left, one at a time. A
// failure whose charge did not reach the limiter (its Check timed out)
// counts here against what the looks see left, while the address has
// checks alive: uncounted, the next look saw as many left as before, and
// 11-12 of a burst were checked for a rule of 10. The
// map holds only addresses with a check in flight or waiting: it is
// bounded by the server's connections.
type authSlots struct {
	mu  sync.Mutex
	ips map[string]*ipChecks
}

// ipChecks is one address's checks on this gateway.
type ipChecks struct {
	tickets  int   // alive: looking, waiting or checking
	inflight int   // admitted and not done
	failed   int64 // failures counted by its checks while tickets > 0
	// uncharged counts, of those, the failures the limiter did not count.
	uncharged int64
	freed     chan struct{} // closed, and replaced, when a check is done
}

func newAuthSlots() *authSlots { return &authSlots{ips: map[string]*ipChecks{}} }

// authTicket is one request's credential check of ip.
type authTicket struct {
	s        *authSlots
	ip       string
	st       *ipChecks
	seen     int64 // st.failed when it last looked
	admitted bool
	// chargeLost: the check failed and the limiter did not count it.
	chargeLost bool
}

// begin starts a check of ip; call done when it is over.
func (s *authSlots) begin(ip string) *authTicket {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.ips[ip]
	if st == nil {
		st = &ipChecks{freed: make(chan struct{})}
		s.ips[ip] = st
	}
	st.tickets++
	return &authTicket{s: s, ip: ip, st: st}
}

// look records that the rule is about to be looked at.
func (t *authTicket) look() {
	t.s.mu.Lock()
	t.seen = t.st.failed
	t.s.mu.Unlock()
}

// admit admits the check if fewer than left are in flight (uncharged
// failures counting as in flight) and no check of the address failed since
// the look; stale says to look again; otherwise wait is closed when a check
// of the address ends, or is nil when none is in flight: the uncharged
// failures used up what was left.
func (t *authTicket) admit(left int64) (ok, stale bool, wait <-chan struct{}) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
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

// errFailuresSpent is await's error when the address's failures that the
// limiter did not count used up what its look saw left.
var errFailuresSpent = errors.New("the address's failures are used up")

// await waits until the check is admitted with left failures (admit),
// or until a check of the address failed since the look (false: look
// again), or ctx ends.
func (t *authTicket) await(ctx context.Context, left int64) (bool, error) {
	for {
		ok, stale, wait := t.admit(left)
		if ok || stale {
			return ok, nil
		}
		if wait == nil {
			return false, errFailuresSpent
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// lostCharge records that the check's failure was not counted by the
// limiter (call before done(true)).
func (t *authTicket) lostCharge() {
	t.s.mu.Lock()
	t.chargeLost = true
	t.s.mu.Unlock()
}

// done ends the check; failed counts it as a failure (charged, or not:
// lostCharge).
func (t *authTicket) done(failed bool) {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	if t.admitted {
		t.st.inflight--
		t.admitted = false
	}
	if failed {
		t.st.failed++
		if t.chargeLost {
			t.st.uncharged++
		}
	}
	close(t.st.freed)
	t.st.freed = make(chan struct{})
	if t.st.tickets--; t.st.tickets == 0 {
		delete(t.s.ips, t.ip)
	}
}
