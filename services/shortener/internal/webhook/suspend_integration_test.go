//go:build integration

package webhook

import (
	"context"
	"testing"
	"time"
)

// A suspended tenant's deliveries are held: not claimed, their attempts
// untouched, and left out of the queue's age and lag (they wait for an
// operator, not a sender, and must not page anyone as a stalled sender);
// another tenant's go out meanwhile. Once the suspension ends (the row
// deleted, as the gateway's resume does) the next claim takes them, as
// they were.
func TestSuspendedTenantsDeliveriesAreHeldUntilResumed(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	store := NewStore(db, time.Second)
	addSubscription(t, db, "abuser", "wh_held", "link.created")
	addSubscription(t, db, "other", "wh_sent", "link.created")
	addDeliveries(t, db, "wh_held", 3)
	addDeliveries(t, db, "wh_sent", 3)
	if _, err := db.Exec(ctx, `UPDATE webhook_deliveries SET queued_at = now() - interval '1 hour',
		next_attempt_at = now() - interval '1 hour' WHERE subscription_id = 'wh_held'`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO tenant_suspensions (tenant) VALUES ('abuser')`); err != nil {
		t.Fatal(err)
	}
	limits := claimLimits{perSub: 100, perTenant: 100}
	claimed, err := store.Claim(ctx, 100, time.Minute, limits, newInFlight())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claimed {
		if c.Tenant != "other" {
			t.Errorf("claimed %s of the suspended tenant %s", c.ID, c.Tenant)
		}
	}
	if len(claimed) != 3 {
		t.Errorf("claimed %d deliveries, want the other tenant's 3", len(claimed))
	}
	var attempts int
	if err := db.QueryRow(ctx, `SELECT sum(attempts) FROM webhook_deliveries WHERE subscription_id = 'wh_held'`).Scan(&attempts); err != nil || attempts != 0 {
		t.Errorf("the held deliveries have %d attempts (%v), want none", attempts, err)
	}
	pending, oldest, lag, err := store.QueueStats(ctx, newInFlight(), limits)
	if err != nil || pending != 6 || oldest > time.Minute || lag != 0 {
		t.Errorf("queue while suspended: %d pending, oldest %s, lag %s (%v); want 6, the held ones' hour in neither age nor lag",
			pending, oldest, lag, err)
	}

	if _, err := db.Exec(ctx, `DELETE FROM tenant_suspensions WHERE tenant = 'abuser'`); err != nil {
		t.Fatal(err)
	}
	if _, _, lag, err := store.QueueStats(ctx, newInFlight(), limits); err != nil || lag < 59*time.Minute {
		t.Errorf("lag after the resume: %s (%v), want the held deliveries' hour counted again", lag, err)
	}
	claimed, err = store.Claim(ctx, 100, time.Minute, limits, newInFlight())
	if err != nil {
		t.Fatal(err)
	}
	if len(claimed) != 3 {
		t.Fatalf("claimed %d deliveries after the resume, want the held 3", len(claimed))
	}
	for _, c := range claimed {
		if c.Tenant != "abuser" || c.Attempts != 1 {
			t.Errorf("after the resume: claimed %s of %s at attempt %d, want the held ones at their first", c.ID, c.Tenant, c.Attempts)
		}
	}
}
