//go:build integration

package webhook

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"kurz.dev/pkg/linkschema"
	"kurz.dev/pkg/testkit/pgtest"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/pkg/testkit/stack"
)

func TestMain(m *testing.M) { stack.Require(m, stack.Postgres) }

// testDB returns a pool on a schema of its own in the test database, with
// the shortener's migrations applied, dropped when the test ends: the
// store's tests see no other test's (or stack's) subscriptions, and no
// sender of theirs claims what they queue.
func testDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return pgtest.Schema(t, "webhook_test", func(ctx context.Context, db *pgxpool.Pool) error {
		_, err := linkschema.Apply(ctx, db)
		return err
	})
}

// addSubscription subscribes tenant's id to events, straight in the table.
func addSubscription(t *testing.T, db *pgxpool.Pool, tenant, id string, events ...string) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `
		INSERT INTO webhook_subscriptions (id, tenant, url, events, secret)
		VALUES ($1, $2, 'https://hooks.example.com/', $3, '\x00')`, id, tenant, events); err != nil {
		t.Fatal(err)
	}
}

// whileBlocked runs write, which must come to wait for a lock the session
// of tx holds, then commits tx, and returns write's error.
func whileBlocked(t *testing.T, db *pgxpool.Pool, tx pgx.Tx, write func() error) error {
	t.Helper()
	ctx := context.Background()
	var pid int64
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- write() }()
	blocked, state := servertest.EventuallyState(10*time.Second, func() (bool, string) {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE $1::int = ANY (pg_blocking_pids(pid))`, pid).Scan(&n); err != nil {
			return false, err.Error()
		}
		return n > 0, fmt.Sprintf("%d sessions wait for the transaction", n)
	})
	if !blocked {
		select {
		case err := <-done:
			t.Fatalf("the write did not wait for the open transaction (%s); it returned %v", state, err)
		default:
			t.Fatalf("the write never waited for the open transaction: %s", state)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return <-done
}

// TestLinkWriteSucceedsWhileItsTenantsSubscriptionIsDeleted: the links
// trigger saw a subscription whose delete had not committed yet, its
// delivery's foreign key check waited for the delete, and once the delete
// committed the link write failed with 23503 (webhook_deliveries_
// subscription_id_fkey). The write must succeed, queueing nothing for the
// deleted subscription and its delivery for the one that stays.
func TestLinkWriteSucceedsWhileItsTenantsSubscriptionIsDeleted(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	addSubscription(t, db, "t1", "wh_gone", "link.created", "link.updated")
	addSubscription(t, db, "t1", "wh_stays", "link.created", "link.updated")
	for _, write := range []struct{ name, sql string }{
		{"create", `INSERT INTO links (code, tenant, long_url) VALUES ('a1', 't1', 'https://example.com/')`},
		{"update", `UPDATE links SET long_url = 'https://example.com/2' WHERE code = 'a1'`},
	} {
		t.Run(write.name, func(t *testing.T) {
			if write.name == "update" {
				addSubscription(t, db, "t1", "wh_gone", "link.updated")
			}
			tx, err := db.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, `DELETE FROM webhook_subscriptions WHERE id = 'wh_gone'`); err != nil {
				t.Fatal(err)
			}
			err = whileBlocked(t, db, tx, func() error {
				_, err := db.Exec(ctx, write.sql)
				return err
			})
			if err != nil {
				t.Fatalf("the link %s while a subscription's delete committed: %v", write.name, err)
			}
		})
	}
	var stays, gone int
	if err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE subscription_id = 'wh_stays'),
		count(*) FILTER (WHERE subscription_id = 'wh_gone') FROM webhook_deliveries`).Scan(&stays, &gone); err != nil {
		t.Fatal(err)
	}
	if stays != 2 || gone != 0 {
		t.Errorf("deliveries: %d for the subscription that stays, %d for the deleted one; want 2 and 0", stays, gone)
	}
}

// TestClickFlushSucceedsWhileASubscriptionIsDeleted: QueueClicks raced a
// link.clicked subscription's delete as the trigger did, and its one
// transaction failed for every tenant's clicks.
func TestClickFlushSucceedsWhileASubscriptionIsDeleted(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	store := NewStore(db, 5*time.Second)
	addSubscription(t, db, "t1", "wh_gone", "link.clicked")
	addSubscription(t, db, "t2", "wh_other", "link.clicked")
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `DELETE FROM webhook_subscriptions WHERE id = 'wh_gone'`); err != nil {
		t.Fatal(err)
	}
	err = whileBlocked(t, db, tx, func() error {
		_, err := store.QueueClicks(ctx, "t1", []clickRow{{batchKey: "a1|s/1-0", data: []byte(`{"code":"a1","clicks":1}`)}}, 100)
		return err
	})
	if err == nil {
		_, err = store.QueueClicks(ctx, "t2", []clickRow{{batchKey: "b1|s/2-0", data: []byte(`{"code":"b1","clicks":1}`)}}, 100)
	}
	if err != nil {
		t.Fatalf("queueing clicks while a subscription's delete committed: %v", err)
	}
	var subs []string
	rows, err := db.Query(ctx, `SELECT subscription_id FROM webhook_deliveries ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	if subs, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(subs) != 1 || subs[0] != "wh_other" {
		t.Errorf("deliveries queued for %v, want the other tenant's subscription only", subs)
	}
}

// addDeliveries queues n pending deliveries of subID, due now.
func addDeliveries(t *testing.T, db *pgxpool.Pool, subID string, n int) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `
		INSERT INTO webhook_deliveries (id, subscription_id, tenant, event_type, data, next_attempt_at)
		SELECT 'evt_' || s.id || '_' || i, s.id, s.tenant, 'link.created', '{}', now() - interval '1 second'
		FROM webhook_subscriptions s, generate_series(1, $2) i WHERE s.id = $1`, subID, n); err != nil {
		t.Fatal(err)
	}
}

func countDeliveries(t *testing.T, db *pgxpool.Pool, subID string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM webhook_deliveries WHERE subscription_id = $1`,
		subID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDeleteOfABusySubscriptionDoesNotWaitForItsDeliveries: a delete
// cascaded over the subscription's whole delivery log in one statement,
// which for a busy one (1.5M deliveries) outlasted the query timeout every
// time: the subscription could not be deleted. Here a delivery's row lock,
// held by another transaction, stands for a log too long to delete in
// time. The delete must answer within the timeout, the subscription leave
// the API, the queueing and the claims at once, and the senders' purge
// remove its deliveries and then its row, the other subscription's
// deliveries staying.
func TestDeleteOfABusySubscriptionDoesNotWaitForItsDeliveries(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	store := NewStore(db, time.Second)
	addSubscription(t, db, "t1", "wh_busy", "link.created")
	addSubscription(t, db, "t1", "wh_other", "link.created")
	addDeliveries(t, db, "wh_busy", 2*pruneBatch+10)
	addDeliveries(t, db, "wh_other", 3)

	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM webhook_deliveries WHERE id = 'evt_wh_busy_1' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	if err := store.Delete(ctx, "t1", "wh_busy"); err != nil {
		t.Fatalf("delete of a subscription with %d deliveries: %v", 2*pruneBatch+10, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := store.Delete(ctx, "t1", "wh_busy"); err != errNotFound {
		t.Errorf("a second delete: %v, want errNotFound", err)
	}
	subs, err := store.List(ctx, "t1")
	if err != nil || len(subs) != 1 || subs[0].ID != "wh_other" {
		t.Errorf("after the delete the tenant lists %v (%v), want wh_other alone", subs, err)
	}
	if _, err := store.Deliveries(ctx, "t1", "wh_busy", "", 10, nil); err != errNotFound {
		t.Errorf("the deleted subscription's deliveries: %v, want errNotFound", err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO links (code, tenant, long_url) VALUES ('b1', 't1', 'https://example.com/')`); err != nil {
		t.Fatal(err)
	}
	claimed, err := store.Claim(ctx, 100, time.Minute, claimLimits{perSub: 100, perTenant: 100}, newInFlight())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claimed {
		if c.SubscriptionID != "wh_other" {
			t.Fatalf("claimed %s of the deleted subscription %s", c.ID, c.SubscriptionID)
		}
	}
	if len(claimed) != 4 {
		t.Errorf("claimed %d deliveries, want wh_other's 3 and its link.created", len(claimed))
	}
	pending, _, _, err := store.QueueStats(ctx, newInFlight(), claimLimits{perSub: 2, perTenant: 4})
	if err != nil || pending != 4 {
		t.Errorf("pending %d (%v), want 4: the deleted subscription's deliveries are not owed", pending, err)
	}

	removed, err := store.PurgeDeleted(ctx)
	if err != nil || removed != 1 {
		t.Fatalf("purge: %d subscriptions removed (%v), want 1", removed, err)
	}
	var rows int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM webhook_subscriptions WHERE id = 'wh_busy'`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if n := countDeliveries(t, db, "wh_busy"); n != 0 || rows != 0 {
		t.Errorf("after the purge: %d deliveries and %d rows of the deleted subscription, want none", n, rows)
	}
	if n := countDeliveries(t, db, "wh_other"); n != 4 {
		t.Errorf("the other subscription has %d deliveries after the purge, want its 4", n)
	}
}

// TestQueueLagLeavesOutWhatTheLimitsHoldBack: the lag counted every due
// delivery, so one tenant's backlog behind receivers that never answer,
// held back by its concurrency limit while the sender had slots free,
// read as a stalled sender (KurzWebhookDeliveriesStalled fired, and its
// runbook's remedy, more concurrency, does nothing for it). Only what a
// sender could claim now counts: not a tenant or a subscription at its
// limit; another tenant's overdue delivery still does.
func TestQueueLagLeavesOutWhatTheLimitsHoldBack(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	store := NewStore(db, 5*time.Second)
	limits := claimLimits{perSub: 2, perTenant: 4}
	addSubscription(t, db, "slow", "wh_slow1", "link.created")
	addSubscription(t, db, "slow", "wh_slow2", "link.created")
	addSubscription(t, db, "slow", "wh_slow3", "link.created")
	addDeliveries(t, db, "wh_slow1", 50)
	addDeliveries(t, db, "wh_slow2", 50)
	addDeliveries(t, db, "wh_slow3", 50)
	if _, err := db.Exec(ctx, `UPDATE webhook_deliveries SET next_attempt_at = now() - interval '10 minutes'`); err != nil {
		t.Fatal(err)
	}
	lagWith := func(sending inFlight) time.Duration {
		t.Helper()
		_, _, lag, err := store.QueueStats(ctx, sending, limits)
		if err != nil {
			t.Fatal(err)
		}
		return lag
	}
	// The slow tenant has 4 in flight (wh_slow1 and wh_slow2 2 each).
	sending := newInFlight()
	for _, sub := range []string{"wh_slow1", "wh_slow1", "wh_slow2", "wh_slow2"} {
		sending.add(claim{Delivery: Delivery{SubscriptionID: sub, Tenant: "slow"}}, 1)
	}
	if lag := lagWith(sending); lag != 0 {
		t.Errorf("lag %v with the tenant's backlog held back by its limit, want 0", lag)
	}
	if lag := lagWith(newInFlight()); lag < 9*time.Minute {
		t.Errorf("lag %v with nothing in flight, want the 10 minutes the deliveries are overdue", lag)
	}
	// Below the tenant's limit, wh_slow3 (nothing in flight) could be
	// claimed; wh_slow1, at its own limit, could not.
	sending.add(claim{Delivery: Delivery{SubscriptionID: "wh_slow2", Tenant: "slow"}}, -1)
	if _, err := db.Exec(ctx, `UPDATE webhook_deliveries SET next_attempt_at = now() - interval '1 minute'
		WHERE subscription_id = 'wh_slow3'`); err != nil {
		t.Fatal(err)
	}
	if lag := lagWith(sending); lag < 9*time.Minute || lag > 11*time.Minute {
		t.Errorf("lag %v with the tenant below its limit, want wh_slow2's 10 minutes", lag)
	}
	if _, err := db.Exec(ctx, `UPDATE webhook_deliveries SET next_attempt_at = now() - interval '1 minute'
		WHERE subscription_id = 'wh_slow2'`); err != nil {
		t.Fatal(err)
	}
	if lag := lagWith(sending); lag < 50*time.Second || lag > 5*time.Minute {
		t.Errorf("lag %v, want the minute of wh_slow2 and wh_slow3, not wh_slow1's 10 (it is at its limit)", lag)
	}
	// Another tenant's due delivery counts, whatever the slow one holds.
	sending.add(claim{Delivery: Delivery{SubscriptionID: "wh_slow3", Tenant: "slow"}}, 1)
	addSubscription(t, db, "other", "wh_other", "link.created")
	addDeliveries(t, db, "wh_other", 1)
	if _, err := db.Exec(ctx, `UPDATE webhook_deliveries SET next_attempt_at = now() - interval '7 minutes'
		WHERE subscription_id = 'wh_other'`); err != nil {
		t.Fatal(err)
	}
	if lag := lagWith(sending); lag < 6*time.Minute || lag > 8*time.Minute {
		t.Errorf("lag %v, want the other tenant's 7 minutes", lag)
	}
}

// TestClaimGivesAFreedSlotToTheTenantWithTheFewestInFlight: the claim
// took the oldest due deliveries first, so two tenants with backlogs
// behind receivers that never answer took every slot that freed (up to
// their limits: all 8 of a replica), and a third tenant's delivery, newer
// than their backlogs, waited 97 s. A freed slot now goes to the tenant
// with the fewest deliveries in flight, oldest due first among equals.
func TestClaimGivesAFreedSlotToTheTenantWithTheFewestInFlight(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	store := NewStore(db, 5*time.Second)
	limits := claimLimits{perSub: 2, perTenant: 4}
	for _, tenant := range []string{"a", "b"} {
		for _, sub := range []string{"1", "2"} {
			addSubscription(t, db, tenant, "wh_"+tenant+sub, "link.created")
			addDeliveries(t, db, "wh_"+tenant+sub, 20)
		}
	}
	if _, err := db.Exec(ctx, `UPDATE webhook_deliveries SET next_attempt_at = now() - interval '1 minute'`); err != nil {
		t.Fatal(err)
	}
	addSubscription(t, db, "c", "wh_c", "link.created")
	addDeliveries(t, db, "wh_c", 1)
	// Tenant a has 3 in flight (one of its 4 just finished), b all 4.
	sending := newInFlight()
	for _, c := range []claim{
		{Delivery: Delivery{SubscriptionID: "wh_a1", Tenant: "a"}}, {Delivery: Delivery{SubscriptionID: "wh_a1", Tenant: "a"}},
		{Delivery: Delivery{SubscriptionID: "wh_a2", Tenant: "a"}},
		{Delivery: Delivery{SubscriptionID: "wh_b1", Tenant: "b"}}, {Delivery: Delivery{SubscriptionID: "wh_b1", Tenant: "b"}},
		{Delivery: Delivery{SubscriptionID: "wh_b2", Tenant: "b"}}, {Delivery: Delivery{SubscriptionID: "wh_b2", Tenant: "b"}},
	} {
		sending.add(c, 1)
	}
	got, err := store.Claim(ctx, 1, time.Minute, limits, sending)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Tenant != "c" {
		var who []string
		for _, c := range got {
			who = append(who, c.Tenant+"/"+c.SubscriptionID)
		}
		t.Fatalf("the freed slot went to %v, want tenant c (nothing in flight) before a (3)", who)
	}
	// With slots for all, each gets what its limits leave, oldest first.
	got, err = store.Claim(ctx, 8, time.Minute, limits, newInFlight())
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for _, c := range got {
		per[c.Tenant]++
	}
	if len(got) != 8 || per["a"] != 4 || per["b"] != 4 {
		t.Errorf("claimed %v of 8 free slots, want a and b 4 each", per)
	}
}

// TestPurgeKeepsUpWithDeletes: a purge removed 100 deleted subscriptions a
// minute, and one pro API key (6,000 calls a minute) creates and deletes
// 3,000: the table grew by about 4 million rows a day, and the click
// batchers' look for link.clicked subscribers, which reads them all every
// 5 s, took 230 ms at 1 million, past the 2 s query timeout within days
// (every tenant's new link.clicked subscriptions then never noticed). A
// purge must remove every deleted subscription there is.
func TestPurgeKeepsUpWithDeletes(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	store := NewStore(db, 5*time.Second)
	addSubscription(t, db, "acme", "wh_live", "link.created")
	if _, err := db.Exec(ctx, `INSERT INTO webhook_subscriptions (id, tenant, url, events, secret, deleted_at)
		SELECT 'wh_gone' || i, 'acme', 'https://hooks.example.com/', '{link.created}', '\x00', now()
		FROM generate_series(1, 250) i`); err != nil {
		t.Fatal(err)
	}
	n, err := store.PurgeDeleted(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var left int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM webhook_subscriptions`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if n != 250 || left != 1 {
		t.Errorf("a purge removed %d of 250 deleted subscriptions, %d rows left; want 250 removed and the live one left", n, left)
	}
}

// addFinished adds n finished deliveries to subID, <prefix><i> made i
// seconds ago for i in 1..n (every third dead, the others succeeded), and
// pending ones: as many as pending, made before all of them, and one made
// now.
func addFinished(t *testing.T, db *pgxpool.Pool, subID, prefix string, n, pending int) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `
		INSERT INTO webhook_deliveries (id, subscription_id, tenant, event_type, data, status, attempts, created_at, last_attempt_at)
		SELECT $3 || i, s.id, s.tenant, 'link.clicked', '{}', CASE WHEN i % 3 = 0 THEN 'dead' ELSE 'succeeded' END, 1,
			now() - make_interval(secs => i), now() - interval '1 minute'
		FROM webhook_subscriptions s, generate_series(1, $2) i WHERE s.id = $1`, subID, n, prefix); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(context.Background(), `
		INSERT INTO webhook_deliveries (id, subscription_id, tenant, event_type, data, created_at)
		SELECT $3 || 'pending' || i, s.id, s.tenant, 'link.created', '{}',
			CASE WHEN i = 0 THEN now() ELSE now() - make_interval(secs => $2 + i) END
		FROM webhook_subscriptions s, generate_series(0, $4) i WHERE s.id = $1`, subID, n, prefix, pending); err != nil {
		t.Fatal(err)
	}
}

// countByStatus returns subID's deliveries per status.
func countByStatus(t *testing.T, db *pgxpool.Pool, subID string) map[string]int {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT status, count(*) FROM webhook_deliveries
		WHERE subscription_id = $1 GROUP BY status`, subID)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for rows.Next() {
		var status string
		var n int
		if err := rows.Scan(&status, &n); err != nil {
			t.Fatal(err)
		}
		got[status] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestFinishedDeliveriesAreCutBackToTheNewestKept: finished deliveries
// were kept the retention (7 days) whatever their number, and link.clicked
// makes one per clicked link, interval and subscription (1,000 links
// clicked a minute, 10 subscriptions: ~100 million rows a week in the
// links' database), so strangers' clicks grew it without bound. A
// subscription over KURZ_SHORTENER_WEBHOOK_KEEP_FINISHED must be cut back
// to it, its newest kept (in the deliveries list's order), its pending
// deliveries, however old, never purged, and other subscriptions (at the
// bound, and past a page of subscriptions) untouched, also with two
// senders trimming at once.
func TestFinishedDeliveriesAreCutBackToTheNewestKept(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	store := NewStore(db, 5*time.Second)
	const keep, over = 100, 2*pruneBatch + 7
	// Quiet subscriptions before the busy one in id order: more than one
	// look of the trim reads.
	if _, err := db.Exec(ctx, `INSERT INTO webhook_subscriptions (id, tenant, url, events, secret)
		SELECT 'wh_a' || lpad(i::text, 3, '0'), 'quiet', 'https://hooks.example.com/', '{link.clicked}', '\x00'
		FROM generate_series(1, 150) i`); err != nil {
		t.Fatal(err)
	}
	addSubscription(t, db, "t1", "wh_busy", "link.clicked")
	addSubscription(t, db, "t1", "wh_full", "link.clicked")
	addSubscription(t, db, "t2", "wh_other", "link.clicked")
	addFinished(t, db, "wh_busy", "evt_busy_", keep+over, 20)
	addFinished(t, db, "wh_full", "evt_full_", keep, 3)
	addFinished(t, db, "wh_other", "evt_other_", 40, 3)

	// Two senders (replicas) trim at once: each delivery goes once, and
	// neither fails on the other's locks.
	var trimmed [2]int64
	var errs [2]error
	var wg sync.WaitGroup
	for i := range trimmed {
		wg.Go(func() { trimmed[i], errs[i] = store.TrimFinished(ctx, keep) })
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		t.Fatal(err)
	}
	if n := trimmed[0] + trimmed[1]; n != over {
		t.Errorf("two trims deleted %d and %d deliveries, want %d together: those past the %d kept", trimmed[0], trimmed[1], over, keep)
	}
	got := countByStatus(t, db, "wh_busy")
	if got[statusSucceeded]+got[statusDead] != keep || got[statusPending] != 21 {
		t.Errorf("the busy subscription has %v after the trim, want %d finished and its 21 pending", got, keep)
	}
	var oldest string
	if err := db.QueryRow(ctx, `SELECT id FROM webhook_deliveries WHERE subscription_id = 'wh_busy' AND status <> 'pending'
		ORDER BY created_at LIMIT 1`).Scan(&oldest); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("evt_busy_%d", keep); oldest != want {
		t.Errorf("the oldest finished delivery kept is %s, want %s: the newest %d kept", oldest, want, keep)
	}
	for sub, want := range map[string]map[string]int{
		"wh_full":  {statusSucceeded: 67, statusDead: 33, statusPending: 4},
		"wh_other": {statusSucceeded: 27, statusDead: 13, statusPending: 4},
	} {
		if got := countByStatus(t, db, sub); !maps.Equal(got, want) {
			t.Errorf("%s has %v after the trim, want %v untouched", sub, got, want)
		}
	}

	// The list and the redelivery work on what is kept.
	ds, err := store.Deliveries(ctx, "t1", "wh_busy", statusDead, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != keep/3 || ds[0].ID != "evt_busy_3" {
		t.Fatalf("listed %d dead deliveries; want the %d kept, newest evt_busy_3", len(ds), keep/3)
	}
	if _, err := store.Redeliver(ctx, "t1", "wh_busy", ds[len(ds)-1].ID); err != nil {
		t.Errorf("redelivering the oldest dead delivery kept: %v", err)
	}
	if n, err := store.TrimFinished(ctx, keep); err != nil || n != 0 {
		t.Errorf("a second trim deleted %d (%v), want none: the redelivered one is pending", n, err)
	}
}

// TestResealMovesTheOldKeysSecretsToTheNewKey: a rotation's pass seals
// again, under the new key, every live secret the old key sealed (over
// more than one page), leaves the new key's and the unopenable ones as
// they are, and the next pass finds nothing to do.
func TestResealMovesTheOldKeysSecretsToTheNewKey(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	store := NewStore(db, 5*time.Second)
	oldKey, newKey := strings.Repeat("o", 32), strings.Repeat("n", 32)
	old, _ := NewSealer(oldKey, "")
	after, _ := NewSealer(newKey, "")
	rotating, _ := NewSealer(newKey, oldKey)
	stranger, _ := NewSealer(strings.Repeat("s", 32), "")
	secrets := map[string]string{}
	seal := func(id string, sealer *Sealer) {
		secrets[id] = newSecret()
		if _, err := db.Exec(ctx, `INSERT INTO webhook_subscriptions (id, tenant, url, events, secret)
			VALUES ($1, 't', 'https://hooks.example.com/', '{link.created}', $2)`, id, sealer.Seal(id, secrets[id])); err != nil {
			t.Fatal(err)
		}
	}
	const olds = resealPage + 20
	for i := range olds {
		seal(fmt.Sprintf("wh_old_%04d", i), old)
	}
	seal("wh_new", after)
	seal("wh_lost", stranger)
	seal("wh_gone", old)
	if _, err := db.Exec(ctx, `UPDATE webhook_subscriptions SET deleted_at = now() WHERE id = 'wh_gone'`); err != nil {
		t.Fatal(err)
	}

	n, unopened, err := store.Reseal(ctx, rotating)
	if err != nil || n != olds || unopened != 1 {
		t.Fatalf("Reseal = %d sealed again, %d unopened, %v; want %d, 1, nil", n, unopened, err, olds)
	}
	rows, err := db.Query(ctx, `SELECT id, secret FROM webhook_subscriptions`)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sealedSecret, error) {
		var v sealedSecret
		return v, r.Scan(&v.id, &v.sealed)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range sealed {
		got, err := after.Open(row.id, row.sealed)
		switch row.id {
		case "wh_lost", "wh_gone":
			if err == nil {
				t.Errorf("%s opens under the new key: a pass sealed what it should have left", row.id)
			}
		default:
			if err != nil || got != secrets[row.id] {
				t.Errorf("%s under the new key alone: %q, %v; want its secret", row.id, got, err)
			}
		}
	}
	if n, unopened, err := store.Reseal(ctx, rotating); err != nil || n != 0 || unopened != 1 {
		t.Errorf("second pass = %d sealed again, %d unopened, %v; want 0, 1, nil", n, unopened, err)
	}
}
