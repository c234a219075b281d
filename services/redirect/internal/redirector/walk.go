package redirector

import (
	"fmt"
	"hash/maphash"
	"math/bits"
	"sync/atomic"
	"time"
)

// walkSlots is the width of each row of a WalkBound: 2 rows of 2^16 slots
// plus one table of last codes, 1.5 MiB in all, however many IPs call.
const walkSlots = 1 << 16

// WalkBound bounds how fast one client IP can look up codes that are not in
// L1, i.e. how fast it can walk existing codes: each IP has a token bucket
// (rate per second, burst) and the lookup past it is refused. Normal
// visitors never meet it: a popular code is answered from L1, which does
// not ask, and a lookup of the same code as the IP's previous counted one
// (a visitor clicking one link again once its L1 entry expired) is free.
//
// Memory is fixed: the buckets are a count-min sketch, two rows of GCRA
// slots (each a theoretical arrival time) indexed by two halves of a keyed
// hash of the IP. Each lookup charges both slots and is refused when both
// are past the burst, so IPs that share a slot in one row are told apart by
// the other; sharing can only make the bound stricter, never looser, and
// rotating addresses never resets anyone's bucket. Lock-free; safe for
// concurrent use.
type WalkBound struct {
	interval int64 // ns per token
	burst    int64 // ns of tokens: burst * interval
	seed     maphash.Seed
	rows     [2][walkSlots]atomic.Int64
	last     [walkSlots]atomic.Uint64 // hash of (IP, code) last counted
}

// CheckWalkBound says why rate and burst cannot shape a WalkBound: rate
// from 0.001 to 1,000,000 lookups per second, burst from 1 to 1,000,000 (so
// that burst times the interval fits in nanoseconds).
func CheckWalkBound(rate float64, burst int) error {
	if !(rate >= 0.001 && rate <= 1e6) || burst < 1 || burst > 1e6 {
		return fmt.Errorf("walk bound %v/s, burst %d: want a rate of 0.001 to 1000000 per second and a burst of 1 to 1000000", rate, burst)
	}
	return nil
}

// NewWalkBound returns a bound of rate lookups per second per IP, with
// bursts of up to burst lookups (see CheckWalkBound).
func NewWalkBound(rate float64, burst int) (*WalkBound, error) {
	if err := CheckWalkBound(rate, burst); err != nil {
		return nil, err
	}
	interval := max(int64(float64(time.Second)/rate), 1)
	return &WalkBound{interval: interval, burst: int64(burst) * interval, seed: maphash.MakeSeed()}, nil
}

// Allow counts a lookup of code by ip at now. It returns 0 when the lookup
// may go on, or how long the IP must wait for its next one.
func (b *WalkBound) Allow(ip, code string, now time.Time) time.Duration {
	h := maphash.String(b.seed, ip)
	i0, i1 := h%walkSlots, (h>>32)%walkSlots
	// Same code as this IP's previous allowed lookup: free. Another IP in
	// the slot in between only costs one more count. A refused lookup is
	// not remembered, or asking twice would get any code through.
	seen := maphash.String(b.seed, code) ^ bits.RotateLeft64(h, 17)
	if b.last[i0].Load() == seen {
		return 0
	}
	t := now.UnixNano()
	wait := min(b.ahead(&b.rows[0][i0], t), b.ahead(&b.rows[1][i1], t))
	if wait > 0 {
		return time.Duration(wait)
	}
	b.charge(&b.rows[0][i0], t)
	b.charge(&b.rows[1][i1], t)
	b.last[i0].Store(seen)
	return 0
}

// ahead is how long before a slot has room for one more lookup: 0 while its
// arrival time is less than a burst ahead of now.
func (b *WalkBound) ahead(slot *atomic.Int64, now int64) int64 {
	return max(slot.Load(), now) + b.interval - now - b.burst
}

// charge moves a slot's arrival time one interval on (from now at the
// earliest). Concurrent charges never lose one.
func (b *WalkBound) charge(slot *atomic.Int64, now int64) {
	for {
		old := slot.Load()
		if slot.CompareAndSwap(old, max(old, now)+b.interval) {
			return
		}
	}
}
