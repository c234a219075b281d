package ratelimit

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

// localLimiter is the in-process stand-in for Redis used by rules with
// failure mode "local". Each replica holds its share of a rule per key, 1/n
// of it for a fleet of n (read at every decision, so shares follow replicas
// as they come and go), rounded down: n replicas together never admit more
// than Redis would, and a share below one unit admits nothing.
//
//   - Token and leaky buckets: a token bucket of capacity floor(burst/n)
//     refilled at limit/window/n. Over any span t a replica admits at most
//     floor(burst/n) + limit/n × t/window, the fleet at most what the
//     Redis bucket admits, burst + limit × t/window.
//   - Fixed window, sliding window counter and sliding log: at most
//     floor(limit/n) units in any interval of one window, wherever it
//     starts (the bound Redis keeps exactly only for the sliding log; a
//     fixed window admits up to twice its limit across a boundary). Each
//     unit is counted in a slot of window/localSlots and held until its
//     slot is a whole window old: at most one slot longer than a sliding
//     log holds it.
type localLimiter struct {
	fleet *Fleet
	keys  *lru.Cache[string, *localState]
	// evicted is when the cache last dropped a key's state to make room
	// (Unix ns). A key met without state within a window of it may be the
	// one dropped, with units still in its window: it starts spent, not
	// fresh, so that a flood of keys cannot reset a key's share (stricter,
	// never looser, also past the cache's size).
	evicted atomic.Int64
}

// localSlots is how many slots a window is cut into for the window
// algorithms' local fallback: a unit is held at most window × (1 +
// 1/localSlots).
const localSlots = 20

// localState is one key's fallback state: tokens for the buckets, counts
// per slot for the window algorithms. A rule that changes from one kind to
// the other finds that kind's state as it was left, or none (a bucket then
// starts full, as on Redis).
type localState struct {
	mu sync.Mutex
	// tokens is what a bucket held at ts (zero ts: a full bucket).
	tokens float64
	ts     time.Time
	// slots counts the units admitted in each of the last localSlots+1
	// slots, a ring indexed by slot number modulo its length; last is the
	// latest instant a window take used (Unix ns).
	slots [localSlots + 1]localSlot
	last  int64
}

type localSlot struct{ id, n int64 }

func newLocalLimiter(fleet *Fleet, size int) (*localLimiter, error) {
	c, err := lru.New[string, *localState](size)
	if err != nil {
		return nil, err
	}
	return &localLimiter{fleet: fleet, keys: c}, nil
}

// bucket reports whether r is decided locally as a token bucket.
func bucket(r *Rule) bool {
	return r.Algorithm == ratelimitv1.Algorithm_ALGORITHM_TOKEN_BUCKET || r.Algorithm == ratelimitv1.Algorithm_ALGORITHM_LEAKY_BUCKET
}

// bucketShare returns this replica's refill rate (units per second) and
// capacity for a token or leaky bucket r.
func (l *localLimiter) bucketShare(r *Rule) (rate, burst float64) {
	n := float64(l.fleet.Size())
	return float64(r.Limit) / r.Window.Seconds() / n, math.Floor(float64(r.capacity()) / n)
}

// windowShare returns how many units this replica may admit in any
// interval of r's window.
func (l *localLimiter) windowShare(r *Rule) int64 {
	return r.Limit / int64(l.fleet.Size())
}

// take consumes cost from key's share if it holds enough, and reports the
// outcome the way the Redis scripts do.
func (l *localLimiter) take(key string, r *Rule, cost int64, now time.Time) result {
	s, ok := l.keys.Get(key)
	if !ok {
		s = l.fresh(r, now)
		prev, found, evicted := l.keys.PeekOrAdd(key, s)
		if found {
			s = prev
		}
		if evicted {
			l.evicted.Store(max(l.evicted.Load(), now.UnixNano()))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return l.decide(s, r, cost, now)
}

// peek reports what a take of cost would decide on key under r, changing
// nothing: not the key's state, and not the keys tracked (a look at a
// fresh key must not push a tracked one out).
func (l *localLimiter) peek(key string, r *Rule, cost int64, now time.Time) result {
	s, ok := l.keys.Peek(key)
	if !ok {
		return l.decide(l.fresh(r, now), r, cost, now)
	}
	var c localState
	s.mu.Lock()
	c.tokens, c.ts, c.slots, c.last = s.tokens, s.ts, s.slots, s.last
	s.mu.Unlock()
	return l.decide(&c, r, cost, now)
}

// fresh is the state of a key the limiter holds none for: full, or spent
// when a key was dropped within r's memory of now (it may have been this
// one, and its units are not to be handed out twice).
func (l *localLimiter) fresh(r *Rule, now time.Time) *localState {
	s := &localState{}
	if ev := l.evicted.Load(); ev != 0 && now.UnixNano()-ev < l.memory(r).Nanoseconds() {
		l.spend(s, r, now)
	}
	return s
}

// decide takes cost from s under r, by r's algorithm (cost 0: a look);
// s is the caller's, or locked by it.
func (l *localLimiter) decide(s *localState, r *Rule, cost int64, now time.Time) result {
	if bucket(r) {
		rate, burst := l.bucketShare(r)
		return s.takeTokens(r, rate, burst, cost, now)
	}
	return s.takeWindow(r, l.windowShare(r), cost, now)
}

// memory is how long a key's state under r matters after its last take:
// a bucket's time to refill its share from empty, a window (and a slot)
// for the window algorithms.
func (l *localLimiter) memory(r *Rule) time.Duration {
	if bucket(r) {
		rate, burst := l.bucketShare(r)
		return time.Duration(burst / rate * float64(time.Second))
	}
	return r.Window + time.Duration(slotLength(r))
}

// spend sets the fresh state s of a key under r as if its whole share had
// been taken at now.
func (l *localLimiter) spend(s *localState, r *Rule, now time.Time) {
	if bucket(r) {
		s.tokens, s.ts = 0, now
		return
	}
	at := now.UnixNano()
	cur := at / slotLength(r)
	s.slots[cur%int64(len(s.slots))] = localSlot{id: cur, n: l.windowShare(r)}
	s.last = at
}

func (s *localState) takeTokens(r *Rule, rate, burst float64, cost int64, now time.Time) result {
	if s.ts.IsZero() {
		s.tokens, s.ts = burst, now
	}
	// Clamped at every take, not only when time has passed: a fleet that
	// grew shrinks every bucket's share at once.
	if elapsed := now.Sub(s.ts).Seconds(); elapsed > 0 {
		s.tokens += elapsed * rate
		s.ts = now
	}
	s.tokens = math.Min(burst, s.tokens)
	res := result{limit: int64(burst), capacity: int64(burst)}
	c := float64(cost)
	switch {
	case s.tokens >= c:
		res.allowed = true
		s.tokens -= c
	case c > burst:
		res.retryAfter = r.Window
	default:
		res.retryAfter = time.Duration(math.Ceil((c - s.tokens) / rate * float64(time.Second)))
	}
	res.remaining = int64(s.tokens)
	res.resetAfter = time.Duration((burst - s.tokens) / rate * float64(time.Second))
	return res
}

// slotLength is the length of one of r's slots in nanoseconds, rounded up
// so that localSlots of them cover at least the window.
func slotLength(r *Rule) int64 {
	return (r.Window.Nanoseconds() + localSlots - 1) / localSlots
}

// count is the number of units admitted in slot id.
func (s *localState) count(id int64) int64 {
	if sl := s.slots[id%int64(len(s.slots))]; sl.id == id {
		return sl.n
	}
	return 0
}

func (s *localState) takeWindow(r *Rule, share, cost int64, now time.Time) result {
	length := slotLength(r)
	// Concurrent requests can reach the lock out of order: a take never
	// goes back in time, so no slot it cannot see holds units yet.
	at := max(now.UnixNano(), s.last)
	s.last = at
	cur := at / length
	// Slots cur-localSlots to cur hold every unit admitted in the last
	// window (and up to a slot more): admitting only while they hold less
	// than the share keeps every interval of one window ending now, and
	// so every interval of one window, at or under the share.
	var used, newest int64 = 0, -1
	for id := cur - localSlots; id <= cur; id++ {
		if n := s.count(id); n > 0 {
			used += n
			newest = id
		}
	}
	res := result{limit: share, capacity: share}
	switch {
	case cost == 0 && used <= share:
		res.allowed = true // a look: no slot gets a unit
	case used+cost <= share:
		res.allowed = true
		sl := &s.slots[cur%int64(len(s.slots))]
		if sl.id != cur {
			*sl = localSlot{id: cur}
		}
		sl.n += cost
		used += cost
		newest = cur
	case cost > share:
		res.retryAfter = r.Window
	default:
		// The oldest slots leave first: wait for those that free enough.
		over := used + cost - share
		for id := cur - localSlots; id <= cur; id++ {
			if over -= s.count(id); over <= 0 {
				res.retryAfter = time.Duration((id+localSlots+1)*length - at)
				break
			}
		}
	}
	res.remaining = max(0, share-used)
	if newest >= 0 {
		res.resetAfter = time.Duration((newest+localSlots+1)*length - at)
	}
	return res
}

// refund gives cost back to key's share (the request was denied by another
// rule, so nothing may stay consumed).
func (l *localLimiter) refund(key string, r *Rule, cost int64) {
	s, ok := l.keys.Peek(key)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if bucket(r) {
		_, burst := l.bucketShare(r)
		s.tokens = math.Min(burst, s.tokens+float64(cost))
		return
	}
	// The units came from a slot of the last window (a request is refunded
	// as soon as it is decided), but which one is not known: take them
	// from the oldest slots of the last window that hold any. No unit
	// admitted later then leaves the count earlier than its own slot would.
	if s.last == 0 {
		return
	}
	newest := s.last / slotLength(r)
	for id := newest - localSlots; id <= newest && cost > 0; id++ {
		sl := &s.slots[id%int64(len(s.slots))]
		if sl.id == id {
			n := min(sl.n, cost)
			sl.n -= n
			cost -= n
		}
	}
}
