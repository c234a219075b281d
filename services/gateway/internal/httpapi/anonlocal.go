package httpapi

import (
	"math"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// anonLocalCapacity bounds the client addresses the local bound on
// anonymous callers remembers (about 100 bytes each).
const anonLocalCapacity = 100_000

// LocalRule is a token bucket the gateway keeps in its own memory: Burst
// tokens, refilled at Limit per minute.
type LocalRule struct {
	Limit int
	Burst int
}

// anonLocal is the gateway's own bound on anonymous callers, per client
// address, for when the limiter does not answer in time. The limiter's
// anonymous-per-ip rule is an abuse limit that must hold (its failure
// mode is local), but the gateway only sees its call time out: failing
// open then let one address push its own checks past the deadline by
// sending them all at once, and pass uncounted. Every anonymous request
// the limiter allows takes a token here too (never refused for want of
// one), and one it does not answer needs a token: so the address's
// answered and unanswered requests together stay within the bucket, per
// gateway replica, stricter than the limiter's rule when that is looser,
// never looser. Past capacity the least recently seen address is
// forgotten; an address met without state within a refill of that starts
// with an empty bucket, so a flood of addresses cannot refill one.
type anonLocal struct {
	mu      sync.Mutex
	rate    float64 // tokens a second
	burst   float64
	now     func() time.Time
	keys    *simplelru.LRU[string, *anonBucket]
	evicted time.Time
}

type anonBucket struct {
	tokens float64
	ts     time.Time
}

func newAnonLocal(rule LocalRule, capacity int, now func() time.Time) *anonLocal {
	l := &anonLocal{rate: float64(rule.Limit) / 60, burst: float64(rule.Burst), now: now}
	// simplelru.NewLRU fails only for a capacity below one.
	l.keys, _ = simplelru.NewLRU(max(capacity, 1), func(string, *anonBucket) { l.evicted = l.now() })
	return l
}

// bucket returns key's bucket refilled to now (l.mu held).
func (l *anonLocal) bucket(key string, now time.Time) *anonBucket {
	b, ok := l.keys.Get(key)
	if !ok {
		b = &anonBucket{tokens: l.burst, ts: now}
		if !l.evicted.IsZero() && now.Sub(l.evicted) < l.refill() {
			b.tokens = 0
		}
		l.keys.Add(key, b)
		return b
	}
	if dt := now.Sub(b.ts); dt > 0 {
		b.tokens = min(l.burst, b.tokens+dt.Seconds()*l.rate)
		b.ts = now
	}
	return b
}

// refill is how long an empty bucket takes to fill.
func (l *anonLocal) refill() time.Duration {
	return time.Duration(l.burst / l.rate * float64(time.Second))
}

// take takes a token of key's bucket for a request the limiter did not
// answer; when there is none it returns false and how long until one.
func (l *anonLocal) take(key string) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bucket(key, l.now())
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := (1 - b.tokens) / l.rate
	return false, time.Duration(math.Ceil(wait * float64(time.Second)))
}

// charge takes a token of key's bucket, if it has one, for a request the
// limiter allowed.
func (l *anonLocal) charge(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b := l.bucket(key, l.now()); b.tokens >= 1 {
		b.tokens--
	}
}
