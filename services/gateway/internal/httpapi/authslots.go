package httpapi

import (
	"context"
	"sync"
)

// authSlots runs the credential checks of one client address on this
// gateway one at a time. The brute-force rule is looked at (cost 0) before
// a check and charged only after a failed one: checks of one address in
// flight together all pass the look before any failure is counted (25-62
// of 200 concurrent guesses were checked, for a rule of 10). One at a
// time, each looks after the last failure was counted, so no more guesses
// are checked than the rule allows (per gateway replica in flight: a
// burst spread over n replicas may have n checked at once). A client's
// requests from one address wait for each other only for the look and the
// check (a key lookup), not for the rest of the request. The map holds
// only addresses with checks in flight or waiting: it is bounded by the
// server's connections.
type authSlots struct {
	mu   sync.Mutex
	busy map[string]chan struct{} // closed when the address's check ends
}

func newAuthSlots() *authSlots { return &authSlots{busy: map[string]chan struct{}{}} }

// take waits until no check of ip is in flight and starts one; release
// ends it.
func (s *authSlots) take(ctx context.Context, ip string) (release func(), err error) {
	for {
		s.mu.Lock()
		ch, busy := s.busy[ip]
		if !busy {
			done := make(chan struct{})
			s.busy[ip] = done
			s.mu.Unlock()
			return func() {
				s.mu.Lock()
				delete(s.busy, ip)
				s.mu.Unlock()
				close(done)
			}, nil
		}
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
