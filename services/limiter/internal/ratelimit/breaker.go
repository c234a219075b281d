package ratelimit

import (
	"sync"
	"time"
)

// breaker stops paying the Redis timeout on every call while a Redis node is
// failing: after `threshold` consecutive failures it opens for `cooldown`,
// during which calls go straight to the rules' failure modes; then one probe
// call is let through. A probe that succeeds closes the breaker; one that
// fails opens it again for twice as long as the last time, up to
// `maxCooldown`.
//
// Consecutive means one after the other in time: a failure counts only if
// its call started after the last counted failure was seen. Calls in flight
// together that one stall cuts at their deadline are one failure, not one
// each: under load 32 decisions waiting on one slow batch used to open the
// breaker at once, and a second of decisions went to the failure modes for
// a stall of a few milliseconds.
//
// The cooldown starts short and grows because the two things that open a
// breaker cost differently. A node that is down costs one probe per
// cooldown: one caller waits for the timeout, the others get their failure
// mode at once, so probing often is cheap. A node that stalls for some tens
// of milliseconds on a loaded machine costs every decision of the whole
// cooldown: with a fixed second, one such stall sent ~4,000 decisions of a
// 10-second bench run to the failure modes (deploy/bench/default-deadline.sh).
type breaker struct {
	threshold   int
	cooldown    time.Duration // the first opening's
	maxCooldown time.Duration // the longest, after failed probes

	mu          sync.Mutex
	failures    int
	lastFailure time.Time     // when the last counted failure was seen
	openUntil   time.Time     // zero while closed
	openFor     time.Duration // the current opening's cooldown
	probing     bool
	// dropped: forget took the breaker out of use (its node is no longer a
	// master) and counted it closed; calls that held it report no changes.
	dropped bool
}

type breakerState int

const (
	breakerClosed breakerState = iota
	breakerOpen
	breakerHalfOpen
)

// allow reports whether a call may go to Redis now, and whether it is the
// half-open state's probe: exactly one caller gets ok then, until it
// reports back (record) or gives up (abandon).
func (b *breaker) allow(now time.Time) (ok, probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.openUntil.IsZero() {
		return true, false
	}
	if now.Before(b.openUntil) || b.probing {
		return false, false
	}
	b.probing = true
	return true, true
}

// abandon ends a probe whose caller gave up before Redis answered: that
// says nothing about Redis, so the next call probes instead. Without it the
// breaker stayed half-open with a probe no one would report, and refused
// every call to its node for good.
func (b *breaker) abandon() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
}

// record reports the outcome of a call that started at start (probe: the
// half-open state's probe) and returns whether the breaker changed between
// open and closed. Any success closes it: Redis answered. A failure while it
// is open counts only if it is the probe's; the others are calls that were
// in flight when it opened.
func (b *breaker) record(ok, probe bool, start, now time.Time) (opened, closed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	wasOpen := !b.openUntil.IsZero()
	if probe {
		b.probing = false
	}
	switch {
	case b.dropped:
		// Counted by forget already: a change reported now would unbalance
		// the open-breakers gauge for good.
		return false, false
	case ok:
		b.failures = 0
		b.openUntil, b.openFor = time.Time{}, 0
		return false, wasOpen
	case wasOpen:
		if probe {
			b.openFor = min(b.openFor, max(b.maxCooldown, b.cooldown)/2) * 2 // no overflow
			b.openUntil = now.Add(b.openFor)
		}
		return false, false
	case !start.After(b.lastFailure):
		return false, false // in flight with the last counted failure
	}
	b.failures++
	b.lastFailure = now
	if b.failures < b.threshold {
		return false, false
	}
	b.openFor = b.cooldown
	b.openUntil = now.Add(b.openFor)
	return true, false
}

func (b *breaker) state(now time.Time) breakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.openUntil.IsZero():
		return breakerClosed
	case now.Before(b.openUntil):
		return breakerOpen
	default:
		return breakerHalfOpen
	}
}

// breakers holds one breaker per Redis master address.
type breakers struct {
	threshold             int
	cooldown, maxCooldown time.Duration
	mu                    sync.Mutex
	byNode                map[string]*breaker
}

func (bs *breakers) get(node string) *breaker {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b := bs.byNode[node]
	if b == nil {
		b = &breaker{threshold: bs.threshold, cooldown: bs.cooldown, maxCooldown: bs.maxCooldown}
		bs.byNode[node] = b
	}
	return b
}

// forget drops the breakers of nodes that are no longer masters (a
// failover, a node removed from the cluster, the whole-cluster breaker once
// the slot map is loaded) and returns how many of them were open: no call
// goes to such a node again, so its breaker would never probe and close, and
// the open-breakers gauge would count it for good.
func (bs *breakers) forget(master func(node string) bool) (wasOpen int) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for node, b := range bs.byNode {
		if master(node) {
			continue
		}
		b.mu.Lock()
		if !b.openUntil.IsZero() {
			wasOpen++
		}
		b.dropped = true
		b.mu.Unlock()
		delete(bs.byNode, node)
	}
	return wasOpen
}
