package redirector

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/redisconn"
)

// verdict is what counting one visit of a visit-limited link decided.
type verdict int

const (
	// visitGranted: the visit was counted and is within the limit.
	visitGranted verdict = iota
	// visitExhausted: the visit was counted past the limit: 410.
	visitExhausted
	// visitUncounted: Redis could not count it. The limit is the link's
	// promise, so the visit is refused (503), never let through uncounted.
	visitUncounted
)

// countScript counts a visit unless the limit (ARGV[1]) is already
// reached, and answers the visit's number: max+1 and more for a refused
// one. Refused visits are not counted, so the counter stops at the limit
// and raising the limit reopens the link by exactly the difference (with
// a plain INCR every refused visit of a popular link pushed the counter on,
// and a raise reopened nothing).
//
// In the same step it gives the counter its link's lifetime (ARGV[2],
// linkcache.VisitsExpireAtMs: PEXPIREAT, or PERSIST for 0; neither creates
// a missing counter, a time past removes it), as linkcache.ExpireVisits
// does. One script, so nothing runs between the count and the expiry: sent
// as a second command, a slot move between the two (the key migrated to
// another node) refused the expiry after the visit was counted, and the
// visit had to be refused (503) rather than counted twice.
const countScript = `local n = tonumber(redis.call('GET', KEYS[1]) or '0')
local visit
if n >= tonumber(ARGV[1]) then visit = n + 1 else visit = redis.call('INCR', KEYS[1]) end
if ARGV[2] == '0' then redis.call('PERSIST', KEYS[1]) else redis.call('PEXPIREAT', KEYS[1], ARGV[2]) end
return visit`

// decideVisit turns the count's answer into a verdict: the n-th visit is
// granted when n <= max. The count is atomic, so with any number of
// concurrent visitors exactly max are granted.
func decideVisit(n int64, err error, max int64) verdict {
	switch {
	case err != nil:
		return visitUncounted
	case n >= 1 && n <= max:
		return visitGranted
	}
	return visitExhausted
}

// countVisit counts one visit of code, whose entry is e, on Redis.
func (h *Handler) countVisit(ctx context.Context, code string, e linkcache.Entry) verdict {
	// A client that hangs up does not cancel the count: a visit it asked
	// for is counted or refused on its merits, never a 503 (and a warning)
	// anyone could cause by aborting requests.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.cfg.VisitTimeout)
	defer cancel()
	n, err := h.incr(ctx, linkcache.VisitsKey(code), e.MaxVisits, e.ExpiresAtMs)
	if err != nil {
		if n, ok := h.visitLogs.Allow(); ok {
			h.log.WarnContext(ctx, "visit not counted; refusing it", "code", code, "failures_not_logged", n, "err", err)
		}
	}
	return decideVisit(n, err, e.MaxVisits)
}

// incr counts one visit at key and gives the counter its link's lifetime
// (countScript), then WAITs until VisitReplicas replicas hold the count,
// in one round trip to the node holding key. A count the replicas did not
// acknowledge within the deadline is an error: the visit is refused (503),
// because a failover to a replica without it would grant that visit again.
//
// While Redis Cluster moves the key's slot, its node may refuse the count
// with MOVED (the slot has moved; this client's view of the cluster is
// older) or ASK (the slot is moving and the key is already on the other
// node). A refused count counted nothing, so the visit is counted once more
// on the node the answer names (redisconn.OnKeyNode): a moving slot costs
// a round trip, not a refused visit.
func (h *Handler) incr(ctx context.Context, key string, limit, expiresAtMs int64) (int64, error) {
	kn, ok := h.visits.(redisconn.KeyNodes)
	if !ok || h.cfg.VisitReplicas == 0 {
		return h.incrOn(ctx, h.visits, key, limit, expiresAtMs, false)
	}
	return redisconn.OnKeyNode(ctx, kn, key, func(ctx context.Context, node *redis.Client, asking bool) (int64, error) {
		return h.incrOn(ctx, node, key, limit, expiresAtMs, asking)
	})
}

// incrOn is incr's round trip to c; asking sends ASKING before each
// command on key, as a node importing key's slot requires.
func (h *Handler) incrOn(ctx context.Context, c redis.Cmdable, key string, limit, expiresAtMs int64, asking bool) (int64, error) {
	replicas := h.cfg.VisitReplicas
	var incr *redis.Cmd
	var wait *redis.Cmd
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		if asking {
			p.Do(ctx, "ASKING")
		}
		// EVAL, not EVALSHA: a pipeline cannot load a script a node lost
		// (a restart, a failover), and this script is short.
		incr = p.Eval(ctx, countScript, []string{key}, limit, linkcache.VisitsExpireAtMs(expiresAtMs))
		if replicas > 0 {
			wait = redisconn.QueueWait(ctx, p, replicas)
		}
		return nil
	})
	if err := incr.Err(); err != nil {
		// Refused (MOVED, ASK), the count ran nowhere: incr may send it
		// to the node named.
		return 0, fmt.Errorf("redis count %s: %w", key, err)
	}
	n, nerr := incr.Int64()
	if nerr != nil {
		return 0, redisconn.AfterWrite(fmt.Errorf("redis count %s: %w", key, nerr))
	}
	if err != nil {
		// The visit was counted, and the WAIT after it failed (the
		// connection, the deadline). Sent again, the visit would be
		// counted twice; it is refused instead (503), counted once.
		return 0, redisconn.AfterWrite(fmt.Errorf("redis incr %s: visit %d counted, then: %w", key, n, err))
	}
	if wait != nil {
		if _, err := redisconn.Held(wait, replicas, fmt.Sprintf("visit %d at %s", n, key)); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// spent reports whether e is visit-limited and its counter at code says
// no visit is left. A counter Redis cannot read says nothing: the count of
// the visit itself decides then.
func (h *Handler) spent(ctx context.Context, code string, e linkcache.Entry) bool {
	if e.MaxVisits <= 0 {
		return false
	}
	left, err := h.visitsLeft(ctx, code, e.MaxVisits)
	return err == nil && !left
}

// visitsLeft reads code's counter without counting: whether a visit would
// still be granted. HEAD requests and link-preview fetchers look, never
// spend.
func (h *Handler) visitsLeft(ctx context.Context, code string, max int64) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.VisitTimeout)
	defer cancel()
	n, err := h.visits.Get(ctx, linkcache.VisitsKey(code)).Int64()
	switch {
	case errors.Is(err, redis.Nil):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("redis get %s: %w", linkcache.VisitsKey(code), err)
	}
	return n < max, nil
}
