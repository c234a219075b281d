//go:build integration

package webhook

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// backlogSender returns a sender on db that bounds a subscription's
// backlog at maxPending, for calling its passes directly.
func backlogSender(db *pgxpool.Pool, maxPending int) *Sender {
	return &Sender{cfg: Config{MaxPending: maxPending}, store: NewStore(db, 2*time.Second),
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), now: time.Now}
}

// backlogged returns subID's backlogged mark.
func backlogged(t *testing.T, db *pgxpool.Pool, subID string) bool {
	t.Helper()
	var b bool
	if err := db.QueryRow(context.Background(), `SELECT backlogged FROM webhook_subscriptions WHERE id = $1`,
		subID).Scan(&b); err != nil {
		t.Fatal(err)
	}
	return b
}

// finishDeliveries marks n of subID's pending deliveries succeeded, as a
// receiver working through its backlog does.
func finishDeliveries(t *testing.T, db *pgxpool.Pool, subID string, n int) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `UPDATE webhook_deliveries
		SET status = 'succeeded', attempts = 1, last_attempt_at = now(), last_status = 200
		WHERE id IN (SELECT id FROM webhook_deliveries WHERE subscription_id = $1 AND status = 'pending' ORDER BY id LIMIT $2)`,
		subID, n); err != nil {
		t.Fatal(err)
	}
}

// updateLinks changes the long URL of each of codes (a link.updated each).
func updateLinks(t *testing.T, db *pgxpool.Pool, codes ...string) {
	t.Helper()
	tag, err := db.Exec(context.Background(), `UPDATE links SET long_url = long_url || 'x' WHERE code = ANY ($1)`, codes)
	if err != nil || tag.RowsAffected() != int64(len(codes)) {
		t.Fatalf("updating %v: %d rows, %v", codes, tag.RowsAffected(), err)
	}
}

// TestBackloggedSubscriptionIsQueuedNoLinkEvents: MaxPending bounded only
// link.clicked; the links trigger queued every link event of a
// subscription whose receiver never answers, and a tenant at its API quota
// with 10 such subscriptions queued up to 300,000 deliveries a minute into
// the shared links database. The sender's pass must mark the subscription
// with MaxPending pending deliveries backlogged, and a link update then
// queue nothing for it, while the tenant's other subscription (one below
// the bound) and another tenant's still get theirs.
func TestBackloggedSubscriptionIsQueuedNoLinkEvents(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	const maxPending = 100
	addSubscription(t, db, "acme", "wh_full", "link.updated")
	addSubscription(t, db, "acme", "wh_ok", "link.updated")
	addSubscription(t, db, "other", "wh_other", "link.updated")
	if _, err := db.Exec(ctx, `INSERT INTO links (code, tenant, long_url)
		VALUES ('a1', 'acme', 'https://example.com/a'), ('o1', 'other', 'https://example.com/o')`); err != nil {
		t.Fatal(err)
	}
	addDeliveries(t, db, "wh_full", maxPending)
	addDeliveries(t, db, "wh_ok", maxPending-1)

	backlogSender(db, maxPending).markBacklogged(ctx)
	if !backlogged(t, db, "wh_full") {
		t.Errorf("the subscription with %d pending is not marked backlogged after the pass", maxPending)
	}
	if backlogged(t, db, "wh_ok") || backlogged(t, db, "wh_other") {
		t.Errorf("a subscription below the bound is marked backlogged: wh_ok %v, wh_other %v",
			backlogged(t, db, "wh_ok"), backlogged(t, db, "wh_other"))
	}

	updateLinks(t, db, "a1", "o1")
	if n := countDeliveries(t, db, "wh_full"); n != maxPending {
		t.Errorf("the backlogged subscription has %d deliveries after a link update, want no more than its %d", n, maxPending)
	}
	if n := countDeliveries(t, db, "wh_ok"); n != maxPending {
		t.Errorf("the tenant's subscription with %d pending has %d deliveries after a link update, want %d (its link.updated queued)",
			maxPending-1, n, maxPending)
	}
	if n := countDeliveries(t, db, "wh_other"); n != 1 {
		t.Errorf("the other tenant's subscription has %d deliveries after its link's update, want 1", n)
	}
}

// TestBackloggedMarkClearsOnceThePendingGoDown: once a backlogged
// subscription's receiver works its pending deliveries below 90% of
// MaxPending, the pass must clear the mark and link events be queued for
// it again; between 90% and MaxPending the mark stays (no flipping at the
// bound with every delivery).
func TestBackloggedMarkClearsOnceThePendingGoDown(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	const maxPending = 100
	addSubscription(t, db, "acme", "wh_full", "link.updated")
	if _, err := db.Exec(ctx, `INSERT INTO links (code, tenant, long_url) VALUES ('a1', 'acme', 'https://example.com/a')`); err != nil {
		t.Fatal(err)
	}
	addDeliveries(t, db, "wh_full", maxPending)
	sender := backlogSender(db, maxPending)
	sender.markBacklogged(ctx)
	if !backlogged(t, db, "wh_full") {
		t.Fatalf("the subscription with %d pending is not marked backlogged after the pass", maxPending)
	}

	const kept = maxPending - maxPending/10 // 90% of the bound
	finishDeliveries(t, db, "wh_full", maxPending-kept)
	sender.markBacklogged(ctx)
	if !backlogged(t, db, "wh_full") {
		t.Errorf("the mark was cleared with %d pending, want it kept until fewer than %d", kept, kept)
	}
	updateLinks(t, db, "a1")
	if n := countDeliveries(t, db, "wh_full"); n != maxPending {
		t.Errorf("the still backlogged subscription has %d deliveries after a link update, want %d", n, maxPending)
	}

	finishDeliveries(t, db, "wh_full", 1)
	sender.markBacklogged(ctx)
	if backlogged(t, db, "wh_full") {
		t.Fatalf("the mark is kept with %d pending, want it cleared below %d", kept-1, kept)
	}
	updateLinks(t, db, "a1")
	if n := countDeliveries(t, db, "wh_full"); n != maxPending+1 {
		t.Errorf("the cleared subscription has %d deliveries after a link update, want %d (its link.updated queued)", n, maxPending+1)
	}
}
