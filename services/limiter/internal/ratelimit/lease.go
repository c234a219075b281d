package ratelimit

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

// Leases: a rule with a lease lets each replica take up to Size units of a
// key from Redis in one script call (lease.lua, by the rule's own
// algorithm) and answer that key's requests from memory until the units run
// out or the lease ends, then give back exactly what it did not hand out.
// Units are taken before they are handed out, so no number of replicas
// admits more than Redis gave; what a lease can cost is under-admission:
// units held unused in other replicas' leases (at most (replicas-1) x Size
// per key at any moment; a take sized for queued callers hands its extra
// units out at once), and the units of a lease whose replica dies before
// giving them back, until the window or bucket refills.

//go:embed lease.lua
var leaseLua string

// leaseSource is the lease script: state.lua's readers (as decisions read
// the same state), then lease.lua.
var leaseSource = stateLua + leaseLua

var leaseScript = redis.NewScript(leaseSource)

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
	case l.TTL%time.Millisecond != 0:
		return fmt.Errorf("rule %s: lease: ttl %v: want a whole number of milliseconds (the lease script counts in them)", r.ID(), l.TTL)
	case r.Shadow:
		return fmt.Errorf("rule %s: lease: not with shadow: a shadow rule reports what Redis would decide and never denies, and a lease would only hide that behind this replica's share", r.ID())
	case r.Queue:
		return fmt.Errorf("rule %s: lease: not with queue: a queued leaky bucket tells each request its delay from the level it finds, and a lease raises the level by its whole size at once", r.ID())
	}
	return nil
}

// maxLeasedKeys bounds the keys a replica holds leases for. A rule's key
// is descriptor values a stranger may choose (a user, an address): without
// a bound, every value seen within a ttl held a lease (about 800 bytes, and
// one more give-back at shutdown). A key past the bound is decided on
// Redis, as unleased: hot keys lease, and there are not 10,000 of them.
const maxLeasedKeys = 10000

// errLeasesFull is a key that finds this replica holding leases for
// maxLeasedKeys others: it is decided on Redis.
var errLeasesFull = errors.New("lease: too many leased keys")

// leaseTable is this replica's leases, one slot per leased key.
type leaseTable struct {
	mu     sync.RWMutex // read-locked on every leased decision
	slots  map[string]*leaseSlot
	closed bool // after ReturnLeases: take only what a request needs
}

// leaseSlot is one key's current lease and its single flight.
type leaseSlot struct {
	key    string
	mu     sync.Mutex
	cur    *lease       // the lease requests draw from, or nil
	flight *leaseFlight // non-nil while a take for this key is in flight
	// demand is the units callers queued behind a flight still need: the
	// next take asks for them too, so that one call serves every caller
	// waiting, not size units' worth of them.
	demand int64
	gone   bool // removed from the table: look the key up again
}

// leaseFlight is the one take in flight for a key; callers that find it
// wait for it, then draw from the lease it installed.
type leaseFlight struct {
	done  chan struct{}
	least int64   // the leader's cost: a denial holds for costs >= it
	err   error   // Redis failed: the waiters' failure modes decide too
	deny  *result // nothing to take: the waiters are denied too
}

// lease is units of one key taken from Redis and not yet given back.
type lease struct {
	id   string
	rule *Rule // the numbers it was taken under; giving back uses them
	at   int64 // Redis ms of the take
	// top counts the units still counted in Redis: taken minus given back
	// (sliding-log members "<id>:1" .. "<id>:<top>").
	top  int64
	left int64 // not handed out
	// start is when the take was sent (local clock), ends its end in Redis
	// ms, last when it last handed out a unit: a sliding log's used units
	// are restamped by it (ending.used).
	start, last time.Time
	ends        int64
	until       time.Time
	ended       bool
	timer       *time.Timer
	// remaining and resetAt are what Redis had left, and when it would be
	// full again, at the take: what a leased allowance reports.
	remaining int64
	resetAt   time.Time
}

// leaseHold is a unit count a request took from a lease, given back if
// another of the request's rules denies.
type leaseHold struct {
	slot  *leaseSlot
	lease *lease
	n     int64
}

// leased is what decideLeased did for a request: which rules it decided,
// what it took from leases, and the groups of rules whose lease could not
// be had from Redis (decided by their failure modes, refunded like others).
type leased struct {
	skip   []bool
	holds  []leaseHold
	failed []*group
}

// errLeaseWait is a take that waited for another caller's lease request
// longer than the decision timeout.
var errLeaseWait = errors.New("lease: waited past the decision timeout")

// decideLeased decides every enforced leased rule of a request from this
// replica's leases, taking a lease from Redis where none has units; a
// key past maxLeasedKeys is left to Redis, as unleased.
func (e *Engine) decideLeased(ctx context.Context, rules []Applied, results []result, cost int64) leased {
	var out leased
	for i, a := range rules {
		// A check-only rule is decided on Redis, as a look (cost 0) is:
		// a lease is for units taken.
		if a.Rule.Lease.Size == 0 || a.Rule.Shadow || a.checkOnly {
			continue
		}
		res, hold, err := e.takeLeased(ctx, a, a.cost(cost))
		if errors.Is(err, errLeasesFull) {
			continue // decided on Redis, as unleased
		}
		if out.skip == nil {
			out.skip = make([]bool, len(rules))
		}
		out.skip[i] = true
		if err != nil {
			g := &group{idx: []int{i}, keys: []string{a.Key}, err: err, abandoned: errors.Is(err, errAbandoned)}
			e.fallback(g, rules, results, cost, time.Now())
			out.failed = append(out.failed, g)
			continue
		}
		results[i] = res
		if hold.lease != nil {
			out.holds = append(out.holds, hold)
		}
	}
	return out
}

// slot returns key's slot, creating it while the table holds fewer than
// maxLeasedKeys; nil when it is full.
func (t *leaseTable) slot(key string) *leaseSlot {
	t.mu.RLock()
	s := t.slots[key]
	t.mu.RUnlock()
	if s != nil {
		return s
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.slots == nil {
		t.slots = map[string]*leaseSlot{}
	}
	s = t.slots[key]
	if s == nil {
		if len(t.slots) >= maxLeasedKeys {
			return nil
		}
		s = &leaseSlot{key: key}
		t.slots[key] = s
	}
	return s
}

// takeLeased takes n units of a's key from this replica's lease, or, when
// it has too few, takes a new lease from Redis (one request per key in
// flight; the others wait for it, at most the decision timeout in all).
func (e *Engine) takeLeased(ctx context.Context, a Applied, n int64) (result, leaseHold, error) {
	deadline := time.Now().Add(e.opts.Timeout)
	fp := fingerprintOf(a.Rule)
	s := e.leases.slot(a.Key)
	if s == nil {
		return result{}, leaseHold{}, errLeasesFull
	}
	// queued is the slot whose demand counts this caller's n while it waits.
	var queued *leaseSlot
	defer func() {
		if queued != nil {
			queued.mu.Lock()
			queued.demand -= n
			queued.mu.Unlock()
			e.dropIfIdle(queued)
		}
	}()
	for {
		s.mu.Lock()
		if s.gone { // never with callers queued: dropIfIdle waits for them
			s.mu.Unlock()
			if s = e.leases.slot(a.Key); s == nil {
				return result{}, leaseHold{}, errLeasesFull
			}
			continue
		}
		now := time.Now()
		if l := s.cur; l != nil && !l.ended && now.Before(l.until) && l.left >= n && fingerprintOf(l.rule) == fp {
			l.left -= n
			l.last = now
			if queued == s { // served: no longer demand for the next take
				s.demand -= n
				queued = nil
			}
			res := l.allowance(now)
			s.mu.Unlock()
			return res, leaseHold{s, l, n}, nil
		}
		if f := s.flight; f != nil {
			if queued == nil {
				queued = s
				s.demand += n
			}
			s.mu.Unlock()
			wait := time.NewTimer(time.Until(deadline))
			select {
			case <-f.done:
				wait.Stop()
			case <-wait.C:
				return result{}, leaseHold{}, errLeaseWait
			case <-ctx.Done():
				wait.Stop()
				return result{}, leaseHold{}, ctx.Err()
			}
			if f.err != nil {
				return result{}, leaseHold{}, f.err
			}
			// The flight's denial answers a waiter of its own size: a
			// larger one would wait longer (see cachedDenial), so it asks
			// on its own.
			if f.deny != nil && n == f.least {
				return *f.deny, leaseHold{}, nil
			}
			continue
		}
		f := &leaseFlight{done: make(chan struct{}), least: n}
		s.flight = f
		old := s.end()
		demand := s.demand // this caller's n included once it has queued
		if queued == nil {
			demand += n
		}
		s.mu.Unlock()
		return e.lead(ctx, s, f, old, a, n, demand)
	}
}

// ending is what an ended lease leaves to give back to Redis.
type ending struct {
	l    *lease
	give int64
	top  int64 // the lease's top before giving back
	// used, for a sliding log that handed out units, is the Redis ms by
	// which it handed out the last: its members left are restamped with it.
	used int64
}

// toRedis reports whether o has anything for Redis: units to give back,
// or a sliding log's members to restamp.
func (o ending) toRedis() bool { return o.give > 0 || o.used > 0 }

// end ends s's current lease, if any, and returns what it leaves to give
// back. s.mu must be held.
func (s *leaseSlot) end() ending {
	l := s.cur
	s.cur = nil
	if l == nil || l.ended {
		return ending{}
	}
	l.ended = true
	l.timer.Stop()
	out := ending{l: l, give: l.left, top: l.top}
	if l.rule.Algorithm == ratelimitv1.Algorithm_ALGORITHM_SLIDING_LOG && l.top > l.left {
		// Redis's ms at the take plus the local time from just before it
		// to the last hand-out: no earlier than the hand-out in Redis's
		// time, and no later than the members' stamp.
		out.used = min(l.ends, l.at+(l.last.Sub(l.start)+time.Millisecond-1).Milliseconds())
	}
	l.top -= l.left
	l.left = 0
	return out
}

// lead runs the flight f: one script call that gives back what the old
// lease left and takes a new lease for a's key, of the lease's size or,
// when more callers are queued, what they need (demand); the caller gets n.
func (e *Engine) lead(ctx context.Context, s *leaseSlot, f *leaseFlight, old ending, a Applied, n, demand int64) (res result, hold leaseHold, err error) {
	r := a.Rule
	give := []any{int64(0), int64(0), int64(0), "", int64(0)}
	if old.toRedis() {
		if fingerprintOf(old.l.rule) == fingerprintOf(r) {
			give = old.args()
		} else {
			e.giveBackToRedis(s.key, old) // under the numbers it was taken under
		}
	}
	want := max(min(r.Lease.Size, r.capacity()), demand)
	e.leases.mu.RLock()
	if e.leases.closed {
		want = n // shutting down: strand nothing
	}
	e.leases.mu.RUnlock()
	id := e.reqPfx + "L" + strconv.FormatUint(e.reqSeq.Add(1), 36)
	args := append(ruleArgs(r), give...)
	args = append(args, want, n, e.opts.Fleet.Size(), r.Lease.TTL.Milliseconds(), id)

	start := time.Now()
	// Not the caller's cancellation: waiters depend on this call too.
	vals, err := e.leaseCall(context.WithoutCancel(ctx), s.key, args)

	s.mu.Lock()
	defer func() {
		s.flight = nil
		close(f.done)
		s.mu.Unlock()
		e.dropIfIdle(s) // nothing was installed after a denial or an error
	}()
	if err != nil {
		f.err = err
		e.giveBackLate(s.key, r, id, err)
		return result{}, leaseHold{}, err
	}
	taken, valid, remaining, retry, reset := vals[0], vals[2], vals[3], vals[4], vals[5]
	if taken == 0 {
		res = result{limit: r.Limit, capacity: r.capacity(), remaining: remaining, resetAfter: time.Duration(reset) * time.Millisecond,
			source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS}
		if retry < 0 {
			res.never, res.retryAfter = true, r.Window
		} else {
			res.retryAfter = time.Duration(retry) * time.Millisecond
		}
		f.deny = &res
		return res, leaseHold{}, nil
	}
	now := time.Now()
	l := &lease{
		id: id, rule: r, at: vals[1], top: taken, left: taken - n,
		start: start, last: now, ends: vals[1] + valid,
		// From before the call: the local end comes no later than Redis's.
		until:     start.Add(time.Duration(valid) * time.Millisecond),
		remaining: remaining,
		resetAt:   start.Add(time.Duration(reset) * time.Millisecond),
	}
	l.timer = time.AfterFunc(time.Until(l.until), func() { e.expire(s, l) })
	s.cur = l
	return l.allowance(now), leaseHold{s, l, n}, nil
}

// allowance is a leased allowance as the rule reports it: remaining is this
// lease's units plus what Redis had left when the lease was taken.
func (l *lease) allowance(now time.Time) result {
	return result{
		allowed: true, limit: l.rule.Limit, capacity: l.rule.capacity(), remaining: l.left + l.remaining,
		resetAfter: max(0, l.resetAt.Sub(now)), source: ratelimitv1.DecisionSource_DECISION_SOURCE_LEASE,
	}
}

// args are the give-back arguments of lease.lua for what o leaves.
func (o ending) args() []any { return []any{o.give, o.top, o.l.at, o.l.id, o.used} }

func ruleArgs(r *Rule) []any {
	return []any{int(r.Algorithm), r.Limit, r.Window.Milliseconds(), r.capacity()}
}

// expire ends l at its end of life and gives back what it did not hand out;
// an idle slot leaves the table.
func (e *Engine) expire(s *leaseSlot, l *lease) {
	s.mu.Lock()
	var old ending
	if s.cur == l {
		old = s.end()
	}
	s.mu.Unlock()
	if old.toRedis() {
		e.giveBackToRedis(s.key, old)
	}
	e.dropIfIdle(s)
}

// dropIfIdle removes s from the table when it holds no lease and no flight,
// so keys no longer leased cost no memory.
func (e *Engine) dropIfIdle(s *leaseSlot) {
	e.leases.mu.Lock()
	defer e.leases.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil && s.flight == nil && s.demand == 0 && !s.gone {
		s.gone = true
		delete(e.leases.slots, s.key)
	}
}

// giveBackLeased returns the units a denied request took from leases: to
// the lease if it is still handing out, else to Redis.
func (e *Engine) giveBackLeased(holds []leaseHold) {
	for _, h := range holds {
		h.slot.mu.Lock()
		l := h.lease
		if !l.ended {
			l.left += h.n
			h.slot.mu.Unlock()
			continue
		}
		old := ending{l: l, give: h.n, top: l.top}
		l.top -= h.n
		h.slot.mu.Unlock()
		e.giveBackToRedis(h.slot.key, old)
	}
}

// giveBackLate gives back what a take the deadline cut took, once its late
// reply (err's, when the call was on a node's pipeline) says it ran: the
// request was answered by its failure mode, as without a lease, and no
// lease holds those units. Its give-back of an earlier lease, if it ran,
// stands.
func (e *Engine) giveBackLate(key string, r *Rule, id string, err error) {
	late := lateReplyOf(err)
	if late == nil {
		return
	}
	e.refunds.Go(func() {
		vals, ok := late.wait()
		if !ok || len(vals) < 2 || vals[0] <= 0 {
			return // not run, its reply lost, or it took nothing
		}
		old := ending{l: &lease{id: id, rule: r, at: vals[1]}, give: vals[0], top: vals[0]}
		ctx, cancel := context.WithTimeout(context.Background(), 10*e.opts.Timeout)
		defer cancel()
		if err := e.giveBack1(ctx, key, old); err != nil {
			e.log.Warn("give-back of a lease take cut at its deadline failed; the units return when the window or bucket refills", "key", key, "units", old.give, "err", err)
		}
	})
}

// giveBackToRedis gives what an ended lease left back to Redis in the
// background; if that fails, the units return when the window or bucket
// refills.
func (e *Engine) giveBackToRedis(key string, old ending) {
	e.refunds.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*e.opts.Timeout)
		defer cancel()
		if err := e.giveBack1(ctx, key, old); err != nil {
			e.log.Warn("lease give-back failed; the units return when the window or bucket refills", "key", key, "units", old.give, "err", err)
		}
	})
}

func (e *Engine) giveBack1(ctx context.Context, key string, old ending) error {
	args := append(ruleArgs(old.l.rule), old.args()...)
	args = append(args, int64(0), int64(0), 1, int64(0), "")
	return leaseScript.Run(ctx, e.rdb, []string{key}, args...).Err()
}

// leaseCall runs lease.lua on key's node, under that node's circuit breaker
// and within the decision timeout, as decisions run decide.lua: through the
// node's pipeline when auto-pipelined, where a call the deadline cut still
// has its late reply (giveBackLate).
func (e *Engine) leaseCall(ctx context.Context, key string, args []any) ([]int64, error) {
	vals, err := e.onRedis(ctx, key, func(ctx context.Context, node string) ([]int64, error) {
		return e.scriptOnRedis(ctx, node, leaseLuaScript, []string{key}, args)
	})
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	return vals, nil
}

// ReturnLeases gives every outstanding lease's unused units back to Redis,
// within ctx, so that a replica shutting down (a rolling restart) strands
// none. Leases taken afterwards hold only what their request needs. Call it
// once the replica has stopped taking requests.
func (e *Engine) ReturnLeases(ctx context.Context) error {
	e.leases.mu.Lock()
	e.leases.closed = true
	var olds []ending
	var keys []string
	for key, s := range e.leases.slots {
		s.mu.Lock()
		if old := s.end(); old.toRedis() {
			olds, keys = append(olds, old), append(keys, key)
		}
		s.mu.Unlock()
	}
	e.leases.mu.Unlock()
	errs := make([]error, len(olds))
	var wg sync.WaitGroup
	for i := range olds {
		wg.Go(func() { errs[i] = e.giveBack1(ctx, keys[i], olds[i]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("return leases: %w", err)
	}
	return nil
}
