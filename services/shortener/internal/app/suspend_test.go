//go:build integration

package app

import (
	"context"
	"testing"
	"time"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
)

// A suspended tenant's webhook events are queued but not sent while its
// row is in tenant_suspensions (what the gateway's suspend writes), and
// are sent, at their first attempt, once the row is gone (the resume);
// another tenant's go out meanwhile. The other tenant's event is made
// after the suspended one's, so the claim that sends it has seen the held
// one too: no wait decides what was not sent.
func TestWebhookDeliveriesOfASuspendedTenantAreHeldUntilResumed(t *testing.T) {
	sh, abuser, ctx, api, rc := webhookSetup(t)
	wh := subscribe(t, ctx, api, rc)
	other := uniq("wh")
	db, _ := stores(t, sh.cfg, other)
	dropWebhooks(t, sh, other)
	otherCtx, otherRC := as(other, ""), newReceiver(t)
	subscribe(t, otherCtx, api, otherRC)
	t.Cleanup(func() {
		_, _ = db.Exec(context.Background(), `DELETE FROM tenant_suspensions WHERE tenant = $1`, abuser)
	})

	if _, err := db.Exec(context.Background(), `INSERT INTO tenant_suspensions (tenant) VALUES ($1)`, abuser); err != nil {
		t.Fatal(err)
	}
	if _, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/held"}); err != nil {
		t.Fatal(err)
	}
	if _, err := sh.api.CreateLink(otherCtx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/sent"}); err != nil {
		t.Fatal(err)
	}
	await(t, "the other tenant's delivery", 10*time.Second, func() bool { return len(otherRC.all()) == 1 })
	if got := rc.all(); len(got) != 0 {
		t.Fatalf("the suspended tenant's receiver got %d deliveries, want none", len(got))
	}
	ds := deliveries(t, ctx, api, wh.GetId())
	if len(ds) != 1 || ds[0].GetStatus() != shortenerv1.WebhookDeliveryStatus_WEBHOOK_DELIVERY_STATUS_PENDING || ds[0].GetAttempts() != 0 {
		t.Fatalf("the suspended tenant's deliveries: %v; want one pending, never attempted", ds)
	}

	if _, err := db.Exec(context.Background(), `DELETE FROM tenant_suspensions WHERE tenant = $1`, abuser); err != nil {
		t.Fatal(err)
	}
	await(t, "the held delivery after the resume", 10*time.Second, func() bool {
		d := deliveries(t, ctx, api, wh.GetId())
		return len(d) == 1 && d[0].GetStatus() == shortenerv1.WebhookDeliveryStatus_WEBHOOK_DELIVERY_STATUS_SUCCEEDED
	})
	if got := rc.all(); len(got) != 1 || got[0].event.Type != "link.created" || got[0].sigErr != nil {
		t.Errorf("after the resume the receiver got %d deliveries (%v), want the held link.created, signed", len(got), got)
	}
	if d := deliveries(t, ctx, api, wh.GetId()); d[0].GetAttempts() != 1 {
		t.Errorf("the held delivery took %d attempts, want 1", d[0].GetAttempts())
	}
}
