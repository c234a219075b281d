package ratelimit

import (
	"fmt"
	"time"
)

// Leases: a rule with a lease lets each replica take up to Size units of a
// key from Redis in one script call (lease.lua, by the rule's own
// algorithm) and answer that key's requests from memory until the units run
// out or the lease ends, then give back exactly what it did not hand out.
// Units are taken before they are handed out, so no number of replicas
// admits more than Redis gave; what a lease can cost is under-admission:
// units held unused in other replicas' leases (at most (replicas-1) x Size
// per key at any moment), and the units of a lease whose replica dies before
// giving them back, until the window or bucket refills.

// Lease is a rule's lease option; the zero value means no lease.
type Lease struct {
	// Size is the most units a replica takes for one key at once.
	Size int64
	// TTL bounds how long a lease hands out units; fixed-window and
	// sliding-window-counter leases also end with their window.
	TTL time.Duration
}

// maxLeaseTTL bounds a lease's TTL: unused units sit in a lease until it
// ends, and a bucket's lease may hand its units out up to TTL after Redis
// gave them.
const maxLeaseTTL = time.Minute

func (r *Rule) validateLease() error {
	l := r.Lease
	switch {
	case l == Lease{}:
		return nil
	case l.Size < 1:
		return fmt.Errorf("rule %s: lease: size must be at least 1", r.ID())
	case l.Size > r.capacity():
		return fmt.Errorf("rule %s: lease: size %d exceeds what the rule holds at once (%d, its burst or limit): a lease could never fill", r.ID(), l.Size, r.capacity())
	case l.TTL < time.Millisecond || l.TTL > maxLeaseTTL:
		return fmt.Errorf("rule %s: lease: ttl %v: want 1ms to %v (unused units wait in a lease until it ends)", r.ID(), l.TTL, maxLeaseTTL)
	case r.Shadow:
		return fmt.Errorf("rule %s: lease: not with shadow: a shadow rule reports what Redis would decide and never denies, and a lease would only hide that behind this replica's share", r.ID())
	case r.Queue:
		return fmt.Errorf("rule %s: lease: not with queue: a queued leaky bucket tells each request its delay from the level it finds, and a lease raises the level by its whole size at once", r.ID())
	}
	return nil
}
