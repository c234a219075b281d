package redirector

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/linkcache"
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

// decideVisit turns the INCR's answer into a verdict: the n-th visit is
// granted when n <= max. INCR is atomic, so with any number of concurrent
// visitors exactly max are granted.
func decideVisit(n int64, err error, max int64) verdict {
	switch {
	case err != nil:
		return visitUncounted
	case n >= 1 && n <= max:
		return visitGranted
	}
	return visitExhausted
}

// countVisit counts one visit of code on Redis.
func (h *Handler) countVisit(ctx context.Context, code string, max int64) verdict {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.VisitTimeout)
	defer cancel()
	n, err := h.visits.Incr(ctx, linkcache.VisitsKey(code)).Result()
	if err != nil {
		h.log.WarnContext(ctx, "visit not counted; refusing it", "code", code, "err", fmt.Errorf("redis incr: %w", err))
	}
	return decideVisit(n, err, max)
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
