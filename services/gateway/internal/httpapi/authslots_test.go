package httpapi

import (
	"errors"
	"testing"
)

// Checks of one address run side by side up to the failures its look saw
// left; past that they wait; a failure sends the waiting ones back to
// look again; an address with nothing in flight leaves the map.
func TestAuthSlotsAdmitUpToTheFailuresLeft(t *testing.T) {
	s := newAuthSlots()
	var admitted []*authTicket
	for i := range 3 {
		tk := s.begin("192.0.2.1")
		tk.look()
		if ok, stale, _ := tk.admit(3); !ok || stale {
			t.Fatalf("check %d of 3 left: ok=%v stale=%v; want admitted", i+1, ok, stale)
		}
		admitted = append(admitted, tk)
	}
	waiting := s.begin("192.0.2.1")
	waiting.look()
	ok, stale, wait := waiting.admit(3)
	if ok || stale || wait == nil {
		t.Fatalf("a 4th check with 3 left: ok=%v stale=%v; want it waiting", ok, stale)
	}
	other := s.begin("198.51.100.1")
	other.look()
	if ok, _, _ := other.admit(3); !ok {
		t.Error("another address's check waited for this one's")
	}
	other.done(false)

	admitted[0].done(false) // a success: the waiting one may go
	select {
	case <-wait:
	default:
		t.Fatal("a check ended and the waiting one was not woken")
	}
	if ok, stale, _ := waiting.admit(3); !ok || stale {
		t.Fatalf("after a success: ok=%v stale=%v; want admitted", ok, stale)
	}
	late := s.begin("192.0.2.1")
	late.look()
	admitted[1].done(true) // a failure, charged: what late saw is stale
	if ok, stale, _ := late.admit(3); ok || !stale {
		t.Fatalf("after a failure since its look: ok=%v stale=%v; want told to look again", ok, stale)
	}
	for _, tk := range []*authTicket{admitted[2], waiting, late} {
		tk.done(false)
	}
	if len(s.ips) != 0 {
		t.Errorf("%d addresses left in the map with nothing in flight", len(s.ips))
	}
}

// Failures the limiter did not count (its Check timed out) count here:
// with 3 left at every look (the limiter never saw a failure), a burst of
// 11 checks of one address that all fail, their charges lost, gets 3
// checked, not more, and the rest are told the failures are spent rather
// than left waiting.
func TestAuthSlotsCountFailuresTheLimiterMissed(t *testing.T) {
	const left, burst = 3, 11
	s := newAuthSlots()
	var tickets []*authTicket
	for range burst { // all alive at once, as concurrent requests are
		tickets = append(tickets, s.begin("192.0.2.1"))
	}
	checked, spent := 0, 0
	for _, tk := range tickets {
		for {
			tk.look()
			ok, err := tk.await(t.Context(), left) // the limiter still says 3 left
			if errors.Is(err, errFailuresSpent) {
				spent++
				tk.done(false)
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				checked++
				tk.lostCharge()
				tk.done(true)
				break
			}
		}
	}
	if checked != left || spent != burst-left {
		t.Errorf("%d checked, %d refused of %d with %d left and every charge lost; want %d checked, %d refused", checked, spent, burst, left, left, burst-left)
	}
	if len(s.ips) != 0 {
		t.Errorf("%d addresses left in the map with nothing in flight", len(s.ips))
	}
}
