package ratelimit

import (
	"math"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// localLimiter is the in-process stand-in for Redis used by rules with
// failure mode "local": a token bucket per key holding this replica's share
// of the rule (limit and burst divided by the fleet's size, read at every
// decision, so shares follow replicas as they come and go), so the fleet as
// a whole stays near the rule's limit while each pod sees only its share of
// the traffic. It is stricter than Redis, never looser.
type localLimiter struct {
	fleet   *Fleet
	buckets *lru.Cache[string, *localBucket]
}

type localBucket struct {
	mu     sync.Mutex
	tokens float64
	ts     time.Time
}

func newLocalLimiter(fleet *Fleet, size int) (*localLimiter, error) {
	c, err := lru.New[string, *localBucket](size)
	if err != nil {
		return nil, err
	}
	return &localLimiter{fleet: fleet, buckets: c}, nil
}

// share returns this replica's rate (tokens per second) and burst for r.
func (l *localLimiter) share(r *Rule) (rate, burst float64) {
	n := float64(l.fleet.Size())
	rate = float64(r.Limit) / r.Window.Seconds() / n
	burst = math.Max(1, math.Floor(float64(r.capacity())/n))
	return rate, burst
}

// take consumes cost from key's bucket if it holds enough, and reports the
// outcome the way the Redis scripts do.
func (l *localLimiter) take(key string, r *Rule, cost int64, now time.Time) result {
	rate, burst := l.share(r)
	b, ok := l.buckets.Get(key)
	if !ok {
		b = &localBucket{tokens: burst, ts: now}
		if prev, found, _ := l.buckets.PeekOrAdd(key, b); found {
			b = prev
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	// Clamped at every take, not only when time has passed: a fleet that
	// grew shrinks every bucket's share at once.
	if elapsed := now.Sub(b.ts).Seconds(); elapsed > 0 {
		b.tokens += elapsed * rate
		b.ts = now
	}
	b.tokens = math.Min(burst, b.tokens)
	res := result{limit: int64(burst)}
	c := float64(cost)
	switch {
	case b.tokens >= c:
		res.allowed = true
		b.tokens -= c
	case c > burst:
		res.retryAfter = r.Window
	default:
		res.retryAfter = time.Duration(math.Ceil((c - b.tokens) / rate * float64(time.Second)))
	}
	res.remaining = int64(b.tokens)
	res.resetAfter = time.Duration((burst - b.tokens) / rate * float64(time.Second))
	return res
}

// refund gives cost back to key's bucket (the request was denied by another
// rule, so nothing may stay consumed).
func (l *localLimiter) refund(key string, r *Rule, cost int64) {
	_, burst := l.share(r)
	if b, ok := l.buckets.Peek(key); ok {
		b.mu.Lock()
		b.tokens = math.Min(burst, b.tokens+float64(cost))
		b.mu.Unlock()
	}
}
