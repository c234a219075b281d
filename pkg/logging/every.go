package logging

import (
	"sync/atomic"
	"time"
)

// Every lets one log line of a kind through per period, with the number of
// its kind left out since the last: a failure a dependency's outage makes
// on every request would otherwise write thousands of lines a second. The
// zero value lets a line through once a second. Safe for concurrent use.
type Every struct {
	// Period is the least time between two lines (zero: one second).
	Period time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time

	last atomic.Int64 // Unix ns of the last line let through
	left atomic.Int64 // lines left out since then, and the one asking
}

// Allow reports whether this line is to be logged, and if so how many of
// its kind were left out since the last one that was.
func (e *Every) Allow() (leftOut int64, ok bool) {
	n := e.left.Add(1)
	now := time.Now
	if e.Now != nil {
		now = e.Now
	}
	t, period := now().UnixNano(), e.Period
	if period <= 0 {
		period = time.Second
	}
	last := e.last.Load()
	if last != 0 && t-last < int64(period) || !e.last.CompareAndSwap(last, t) {
		return 0, false
	}
	e.left.Add(-n)
	return n - 1, true
}
