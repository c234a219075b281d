package linkapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/services/shortener/internal/linkstore"
)

// A change of an existing link (UpdateLink, DeleteLink) must reach the
// redirect service even if Redis fails at that moment: a revoked link that
// kept redirecting for the cache TTL (24 h) would be a takedown that did not
// happen. So the change queues an invalidation in PostgreSQL in its own
// statement (linkstore), the call tries to refresh Redis at once, and
// RunInvalidations retries whatever is still queued until Redis has the
// link's current state. Redirect pods need nothing more: every successful
// refresh publishes on linkcache.InvalidationChannel, which drops the code
// from the L1 of every subscribed pod; a pod that was disconnected meanwhile
// purges its whole L1 when it subscribes again; and L1 keeps only entries
// read from Redis, for KURZ_REDIRECT_L1_TTL (5 s), so even a lost message
// leaves the old state there at most that long once Redis has the new one.

// invalidationBatch bounds the codes one pass of RunInvalidations takes.
const invalidationBatch = 100

// refresh writes code's current state through to Redis after a committed
// change that queued an invalidation. A failure does not fail the call (the
// change is committed, and the queued invalidation is retried by
// RunInvalidations): it is logged and counted.
func (s *Service) refresh(ctx context.Context, op, code string) {
	ctx = context.WithoutCancel(ctx)
	if err := s.store.Refresh(ctx, code, s.storeEntry); err != nil {
		s.m.cacheFailed.Add(ctx, 1, metric.WithAttributes(attribute.String("op", op)))
		s.log.WarnContext(ctx, "write-through failed; queued for retry", "op", op, "code", code, "err", err)
	}
}

// storeEntry sets l's Redis entry and publishes the invalidation, and
// fails unless Options.CacheReplicas replicas hold the entry in time (so
// the invalidation stays queued, and a failover cannot undo it), then
// deletes a deleted link's visit counter (a code is never reused, so the
// counter would only take room) and gives any other link's counter the
// lifetime of the link's current expiry (linkcache.ExpireVisits). The
// redirect sets that lifetime with every visit too, but an expiry cleared
// or moved later with no visit in between would otherwise leave the
// counter to end before its link, handing out the spent visits again.
// Every command is idempotent, so a retry after a partial failure is
// harmless.
func (s *Service) storeEntry(ctx context.Context, l linkstore.Link) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.CacheTimeout)
	defer cancel()
	if err := linkcache.WriteThroughHeld(ctx, s.rdb, l.Code, entry(l), s.opts.CacheTTL, s.opts.CacheReplicas); err != nil {
		return err
	}
	key := linkcache.VisitsKey(l.Code)
	if l.Deleted != nil {
		if err := s.rdb.Del(ctx, key).Err(); err != nil {
			return fmt.Errorf("redis del %s: %w", key, err)
		}
		return nil
	}
	var expiresAtMs int64
	if l.Expires != nil {
		expiresAtMs = l.Expires.UnixMilli()
	}
	if err := linkcache.ExpireVisits(ctx, s.rdb, key, expiresAtMs).Err(); err != nil {
		return fmt.Errorf("redis expire %s: %w", key, err)
	}
	return nil
}

// RunInvalidations retries queued invalidations until ctx ends, every
// Options.RetryInterval. Each pass takes the due codes, oldest first, and
// refreshes them; a failure postpones its code (exponential backoff) and
// the pass goes on, since one failing code (its Redis master down, a
// poison code) must not hold back the takedowns queued after it. Failures
// are bounded per Redis master (maxNodeFailures in a row): once one fails
// that often, its further codes are postponed untried, as they would
// probably wait out the same timeout, and codes on other masters are still
// refreshed in the same pass. Every replica runs it: two refreshing one
// code at once both write its current state.
func (s *Service) RunInvalidations(ctx context.Context) {
	tick := time.NewTicker(s.opts.RetryInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		codes, err := s.store.DueInvalidations(ctx, invalidationBatch)
		if err != nil {
			s.log.WarnContext(ctx, "reading queued invalidations failed", "err", err)
			continue
		}
		if !s.retryPass(ctx, codes) {
			return
		}
	}
}

// maxNodeFailures bounds the failed refreshes in a row one pass of
// RunInvalidations tries on one Redis master.
const maxNodeFailures = 3

// retryPass is one pass of RunInvalidations over codes; false once ctx
// ended (the invalidations not refreshed stay queued).
func (s *Service) retryPass(ctx context.Context, codes []string) bool {
	failures := map[string]int{} // by master address
	for _, code := range codes {
		node := s.nodeOf(ctx, code)
		if failures[node] < maxNodeFailures {
			err := s.store.Refresh(ctx, code, s.storeEntry)
			if err == nil {
				failures[node] = 0
				continue
			}
			if ctx.Err() != nil {
				return false
			}
			failures[node]++
			s.m.cacheFailed.Add(ctx, 1, metric.WithAttributes(attribute.String("op", "retry")))
			s.log.WarnContext(ctx, "queued write-through failed; retrying later", "code", code, "err", err)
		}
		if err := s.store.Postpone(ctx, code, s.opts.RetryInterval, s.opts.RetryMaxDelay); err != nil {
			if ctx.Err() != nil {
				return false
			}
			s.log.WarnContext(ctx, "postponing an invalidation failed", "code", code, "err", err)
		}
	}
	return true
}

// nodeOf names the Redis master that holds code's entry, from the
// client's view of the cluster; "" (one node for every code) when the
// client is no cluster's or does not know.
func (s *Service) nodeOf(ctx context.Context, code string) string {
	kn, ok := s.rdb.(redisconn.KeyNodes)
	if !ok {
		return ""
	}
	c, err := kn.MasterForKey(ctx, linkcache.Key(code))
	if err != nil {
		return ""
	}
	return c.Options().Addr
}

// observeInvalidations exports the queue of invalidations: how many wait and
// the age of the oldest. Every replica reports the same shared table.
func observeInvalidations(meter metric.Meter, store Store) error {
	pending, err1 := meter.Int64ObservableGauge("kurz.shortener.invalidations.pending",
		metric.WithDescription("Links whose change has not reached Redis yet (queued in link_invalidations, retried with backoff)"),
		metric.WithUnit("{invalidation}"))
	oldest, err2 := meter.Float64ObservableGauge("kurz.shortener.invalidations.oldest_age",
		metric.WithDescription("How long the oldest queued invalidation has waited (0: none); meanwhile redirects may serve the link's previous state"),
		metric.WithUnit("s"))
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	_, err := meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		n, age, err := store.PendingInvalidations(ctx)
		if err != nil {
			return err
		}
		o.ObserveInt64(pending, n)
		o.ObserveFloat64(oldest, age.Seconds())
		return nil
	}, pending, oldest)
	return err
}
