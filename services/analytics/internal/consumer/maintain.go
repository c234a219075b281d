package consumer

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/clickevent"
)

// maintain measures the lag and reclaims idle pending entries every
// ClaimEvery, until ctx ends.
func (c *Consumer) maintain(ctx, hard context.Context) {
	tick := time.NewTicker(c.opts.ClaimEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c.refreshLag(ctx)
		// Claims stop at until: see stalled.
		until := time.Now().Add(c.claimMargin())
		// A consumer that cannot store what it holds must not take more
		// from others: that would only count deliveries towards the
		// dead-letter limit while ClickHouse is down. Nor may a stalled
		// one (an insert that hangs, a batcher far behind): it would claim
		// its own idle entries back from itself, again and again, and each
		// claim is a delivery, until a healthy consumer that finally takes
		// them dead-letters good clicks.
		if c.failing() || c.stalled(ctx) {
			if h := c.opts.hooks.claimSkipped; h != nil {
				h()
			}
			continue
		}
		for shard := range c.keys {
			if !c.claim(ctx, hard, shard, until) {
				return
			}
		}
		c.forgetIdle(ctx)
	}
}

// forgetIdle removes the consumers ForgetIdle has passed for (see
// Options.ForgetIdle) from every shard's group.
func (c *Consumer) forgetIdle(ctx context.Context) {
	gone, err := clickevent.ForgetIdleConsumers(ctx, c.rdb, c.keys, c.opts.Group, c.opts.Name, c.opts.ForgetIdle)
	if err != nil && ctx.Err() == nil {
		c.log.Warn("forgetting idle consumers", "err", err)
	}
	if len(gone) > 0 {
		c.log.Info("forgot idle consumers with nothing pending", "consumers", gone, "idle_at_least", c.opts.ForgetIdle)
	}
}

// stalled reports whether any entry this consumer holds has been pending
// with it for ClaimIdle less the claim margin: what it reads or claims is
// in its memory until acknowledged, so such an entry means its batcher is
// not keeping up. Not all of ClaimIdle: an entry just under it here would
// be over it a moment later, when claim runs, and be claimed back from
// ourselves (a delivery counted, seen in TestStalledConsumerClaimsNothing).
// So the claims of a tick stop once the margin has passed since this
// check began (the rest waits for the next tick): an own entry under the
// threshold here is still under ClaimIdle when they run. The margin stays
// small beside ClaimIdle, so a healthy consumer whose flushes are merely
// slow still takes over a dead one's entries.
func (c *Consumer) stalled(ctx context.Context) bool {
	for _, key := range c.keys {
		idle, err := c.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: key, Group: c.opts.Group, Consumer: c.opts.Name,
			Idle: c.opts.ClaimIdle - c.claimMargin(), Start: "-", End: "+", Count: 1,
		}).Result()
		if err == nil && len(idle) > 0 {
			return true
		}
	}
	return false
}

// claimMargin is how long a tick's claims may run after its stall check:
// ClaimEvery (a tick's length), at most a quarter of ClaimIdle.
func (c *Consumer) claimMargin() time.Duration { return min(c.opts.ClaimEvery, c.opts.ClaimIdle/4) }

// claimRounds bounds the XAUTOCLAIM calls per shard and tick.
const claimRounds = 10

// claim takes over entries of shard idle for ClaimIdle (from any consumer,
// this one included), dead-letters those delivered more than MaxDeliveries
// times and hands the rest to the batcher, until the time until (see
// stalled). False means stop.
func (c *Consumer) claim(ctx, hard context.Context, shard int, until time.Time) bool {
	key := c.keys[shard]
	start := "0-0"
	for range claimRounds {
		if !time.Now().Before(until) {
			return true // the next tick goes on
		}
		msgs, next, deleted, err := c.rdb.XAutoClaimWithDeleted(ctx, &redis.XAutoClaimArgs{
			Stream: key, Group: c.opts.Group, Consumer: c.opts.Name,
			MinIdle: c.opts.ClaimIdle, Start: start, Count: int64(c.opts.ReadCount),
		}).Result()
		if err != nil {
			if ctx.Err() == nil && !strings.HasPrefix(err.Error(), "NOGROUP") {
				c.log.Warn("click stream claim failed", "stream", key, "err", err)
			}
			return ctx.Err() == nil
		}
		if len(deleted) > 0 {
			// Trimmed by MAXLEN while pending: Redis drops them from the
			// pending list; the clicks are lost.
			c.m.trimmed(len(deleted))
			c.log.Error("pending click entries were trimmed from the stream before being stored",
				"stream", key, "entries", len(deleted))
		}
		if len(msgs) > 0 {
			c.m.claimed(len(msgs))
			counts := c.deliveries(ctx, key, msgs)
			var fresh []redis.XMessage
			var dead []poisoned
			es := toEntries(shard, msgs, true)
			for i, m := range msgs {
				if n := counts[m.ID]; n > int64(c.opts.MaxDeliveries) {
					dead = append(dead, poisoned{&es[i], fmt.Sprintf("delivered %d times without being stored (limit %d)", n, c.opts.MaxDeliveries), "deliveries"})
					continue
				}
				fresh = append(fresh, m)
			}
			c.log.Info("claimed idle click entries", "stream", key, "entries", len(msgs), "dead_lettered", len(dead))
			if len(dead) > 0 {
				if err := c.deadLetter(ctx, dead); err != nil {
					c.log.Warn("click dead-letter failed; entries stay pending", "stream", key, "err", err)
				} else {
					var ids []string
					for _, p := range dead {
						ids = append(ids, p.e.id)
					}
					if err := c.rdb.XAck(ctx, key, c.opts.Group, ids...).Err(); err != nil {
						c.log.Warn("click dead-letter ack failed", "stream", key, "err", err)
					}
				}
			}
			if len(fresh) > 0 && !c.send(hard, toEntries(shard, fresh, true)) {
				return false
			}
		}
		if next == "0-0" || next == "" {
			return true
		}
		start = next
	}
	return true
}

// deliveries returns the delivery counts of msgs (just claimed, so now this
// consumer's), from XPENDING.
func (c *Consumer) deliveries(ctx context.Context, key string, msgs []redis.XMessage) map[string]int64 {
	out := make(map[string]int64, len(msgs))
	pend, err := c.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: key, Group: c.opts.Group, Consumer: c.opts.Name,
		Start: msgs[0].ID, End: msgs[len(msgs)-1].ID, Count: int64(len(msgs)) + 10_000,
	}).Result()
	if err != nil {
		c.log.Warn("click stream pending lookup failed", "stream", key, "err", err)
		return out
	}
	for _, p := range pend {
		out[p.ID] = p.RetryCount
	}
	return out
}

// deadLetter copies poisoned entries to their shard's dead-letter stream
// with the reason, the source stream and the entry ID. The caller
// acknowledges them.
func (c *Consumer) deadLetter(ctx context.Context, items []poisoned) error {
	dctx, cancel := context.WithTimeout(ctx, c.opts.InsertTimeout)
	defer cancel()
	pipe := c.rdb.Pipeline()
	for _, p := range items {
		vals := make([]any, 0, 2*len(p.e.values)+6)
		for k, v := range p.e.values {
			vals = append(vals, k, v)
		}
		vals = append(vals, "reason", p.reason, "stream", c.keys[p.e.shard], "entry_id", p.e.id)
		pipe.XAdd(dctx, &redis.XAddArgs{Stream: c.deadKeys[p.e.shard], MaxLen: c.opts.DeadLetterMaxLen, Approx: true, Values: vals})
	}
	if _, err := pipe.Exec(dctx); err != nil {
		return fmt.Errorf("redis dead-letter xadd: %w", err)
	}
	for _, p := range items {
		c.m.deadLettered(p.kind)
		c.log.Warn("click entry dead-lettered", "stream", c.keys[p.e.shard], "entry_id", p.e.id,
			"dead_letter_stream", c.deadKeys[p.e.shard], "reason", p.reason)
	}
	return nil
}

// ShardLag is one shard's backlog for the group.
type ShardLag struct {
	Stream string `json:"stream"`
	// Pending entries were delivered and not acknowledged yet.
	Pending int64 `json:"pending"`
	// Unread entries were never delivered (clickevent.Backlog).
	Unread int64 `json:"unread"`
	// Overrun: a trim has passed the group's last delivered entry, so
	// entries nobody read were trimmed (clickevent.Backlog).
	Overrun bool `json:"overrun"`
}

// refreshLag reads every shard's backlog (clickevent.Lags: Redis 7 can
// report a lag that never clears after a trim overran the group).
func (c *Consumer) refreshLag(ctx context.Context) {
	lags := make([]ShardLag, 0, len(c.keys))
	for _, key := range c.keys {
		l := ShardLag{Stream: key}
		b, _, err := c.lags.Read(ctx, key)
		if err != nil && ctx.Err() == nil {
			c.log.Warn("click stream lag unavailable", "stream", key, "err", err)
		}
		l.Pending, l.Unread, l.Overrun = b.Pending, b.Unread, b.Overrun
		lags = append(lags, l)
	}
	c.mu.Lock()
	c.lag = lags
	c.mu.Unlock()
}

// lagSummary renders the last measured lag for logs.
func (c *Consumer) lagSummary() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	var total int64
	for _, l := range c.lag {
		total += l.Pending + l.Unread
		if l.Pending+l.Unread > 0 {
			fmt.Fprintf(&b, " %s=%d+%d", l.Stream, l.Pending, l.Unread)
		}
	}
	if len(c.lag) == 0 {
		return "unknown (not measured yet, or Redis unreachable)"
	}
	if total == 0 {
		return "0 entries"
	}
	return fmt.Sprintf("%d entries (pending+unread:%s)", total, b.String())
}
