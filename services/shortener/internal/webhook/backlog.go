package webhook

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// backlogEvery is how often a sender marks the subscriptions whose backlog
// reached MaxPending (and clears those whose backlog went down). The mark
// is what bounds the link events a subscription is queued, so a
// subscription grows past MaxPending by what its tenant writes in this
// long: at the pro quota (30,000 link writes a minute) 2,500 deliveries.
// The housekeeping's minute would let it grow 30,000 past; a pass costs
// one statement per page of subscriptions, each walking at most
// trimEntries index entries, so every few seconds is cheap.
const backlogEvery = 5 * time.Second

// backlogChange is a subscription whose backlogged mark a pass changed.
type backlogChange struct {
	ID, Tenant string
	Backlogged bool
}

// clearBelow is the pending count under which a backlogged subscription's
// mark is cleared: 90% of maxPending, so that a receiver working through
// its backlog does not flip the mark (and its link events) on and off
// with every delivery at the bound.
func clearBelow(maxPending int) int { return maxPending - maxPending/10 }

// MarkBacklogged sets webhook_subscriptions.backlogged on every live
// subscription with at least maxPending pending deliveries, and clears it
// on those marked with fewer than clearBelow(maxPending); it writes only
// the subscriptions whose mark changes and returns them. The links
// trigger queues no link event for a marked subscription (see
// pkg/linkschema/0020_webhooks_backlogged.sql): counting the backlog there
// would cost every link write a count.
//
// The backlog is counted up to maxPending entries of the due index
// (subscription_id, next_attempt_at) WHERE status = 'pending', as the
// click flush counts it, so a pass reads no more however large a backlog
// grew. It looks at the subscriptions in id order, as many a statement as
// maxPending entries of each fit in trimEntries (at most
// purgeSubscriptions), each statement within the query timeout. Senders
// of several replicas may pass together: the update checks the mark it
// read again on the row it locked, so a change is made (and reported)
// once.
func (s *Store) MarkBacklogged(ctx context.Context, maxPending int) ([]backlogChange, error) {
	page := max(1, min(purgeSubscriptions, trimEntries/maxPending))
	var changes []backlogChange
	after := ""
	for {
		got, last, err := s.markBackloggedOnce(ctx, after, maxPending, page)
		changes = append(changes, got...)
		if err != nil || last == "" {
			return changes, err
		}
		after = last
	}
}

// markBackloggedOnce makes one statement of MarkBacklogged over the page
// live subscriptions after the id after, and returns the changes and the
// page's last id ("" when there was none).
func (s *Store) markBackloggedOnce(ctx context.Context, after string, maxPending, page int) ([]backlogChange, string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var (
		last    *string
		changes []backlogChange
	)
	rows, err := s.db.Query(ctx, `
		WITH subs AS (
			SELECT s.id, s.backlogged, (SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries d
				WHERE d.subscription_id = s.id AND d.status = 'pending' LIMIT $2) p) AS pending
			FROM webhook_subscriptions s
			WHERE s.id > $1 AND s.deleted_at IS NULL
			ORDER BY s.id LIMIT $3),
		changed AS (
			UPDATE webhook_subscriptions w SET backlogged = NOT w.backlogged
			FROM subs
			WHERE w.id = subs.id AND w.backlogged = subs.backlogged
			  AND CASE WHEN subs.backlogged THEN subs.pending < $4 ELSE subs.pending >= $2 END
			RETURNING w.id, w.tenant, w.backlogged)
		SELECT (SELECT max(id) FROM subs), id, tenant, backlogged FROM changed
		UNION ALL
		SELECT (SELECT max(id) FROM subs), NULL, NULL, NULL WHERE NOT EXISTS (SELECT 1 FROM changed)`,
		after, maxPending, page, clearBelow(maxPending))
	if err != nil {
		return nil, "", fmt.Errorf("mark backlogged webhooks: %w", err)
	}
	var (
		id, tenant *string
		backlogged *bool
	)
	_, err = pgx.ForEachRow(rows, []any{&last, &id, &tenant, &backlogged}, func() error {
		if id != nil {
			changes = append(changes, backlogChange{ID: *id, Tenant: *tenant, Backlogged: *backlogged})
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("mark backlogged webhooks: %w", err)
	}
	if last == nil {
		return changes, "", nil
	}
	return changes, *last, nil
}

// BackloggedSubscriptions returns how many live subscriptions are marked
// backlogged: their link events are not queued, and lost to them, while
// they are.
func (s *Store) BackloggedSubscriptions(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var n int64
	err := s.db.QueryRow(ctx, `SELECT count(*) FROM webhook_subscriptions
		WHERE backlogged AND deleted_at IS NULL`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("backlogged webhooks: %w", err)
	}
	return n, nil
}

// watchBacklogs runs a MarkBacklogged pass every backlogEvery until ctx
// ends, and logs each subscription whose mark changed: its link events
// are lost from the mark until it is cleared, which a tenant asking where
// its events went needs to find.
func (s *Sender) watchBacklogs(ctx context.Context) {
	tick := time.NewTicker(backlogEvery)
	defer tick.Stop()
	for ctx.Err() == nil {
		s.markBacklogged(ctx)
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// markBacklogged makes one pass of watchBacklogs.
func (s *Sender) markBacklogged(ctx context.Context) {
	changes, err := s.store.MarkBacklogged(ctx, s.cfg.MaxPending)
	for _, c := range changes {
		if c.Backlogged {
			s.log.Warn("webhook subscription backlogged: its link events are not queued until its pending deliveries go down",
				"subscription", c.ID, "tenant", c.Tenant, "max_pending", s.cfg.MaxPending)
		} else {
			s.log.Info("webhook subscription no longer backlogged: its link events are queued again",
				"subscription", c.ID, "tenant", c.Tenant, "pending_below", clearBelow(s.cfg.MaxPending))
		}
	}
	if err != nil && ctx.Err() == nil {
		s.log.Warn("webhook deliveries: marking the backlogged subscriptions failed; the next pass goes on", "err", err)
	}
}
