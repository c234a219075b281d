//go:build integration

package webhook

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/clickevent"
)

// ackRecorder is the Redis of a ClickBatcher's flush: it records the
// entries acknowledged (nothing else is called).
type ackRecorder struct {
	redis.Cmdable
	acked []string
}

func (r *ackRecorder) XAck(ctx context.Context, stream, group string, ids ...string) *redis.IntCmd {
	for _, id := range ids {
		r.acked = append(r.acked, stream+"/"+id)
	}
	cmd := redis.NewIntCmd(ctx)
	cmd.SetVal(int64(len(ids)))
	return cmd
}

// TestClickFlushOfOneTenantDoesNotHoldBackTheOthers: a flush queued every
// tenant's link.clicked deliveries in one transaction of 8 s (4 query
// timeouts): a tenant with 10 link.clicked subscriptions and ~15,000 links
// clicked in an interval (10,000 took 7.8 s on the local stack) failed it
// for every tenant, interval after interval, and nothing was acknowledged.
// Here a constraint that refuses that tenant's deliveries stands for its
// volume (a lock waited out to the query timeout would make the test
// depend on the machine's speed).
// The other tenant's delivery must be queued and its click acknowledged;
// the stuck tenant's click stays pending, to be claimed again.
func TestClickFlushOfOneTenantDoesNotHoldBackTheOthers(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	store := NewStore(db, 5*time.Second)
	for i := range 10 {
		addSubscription(t, db, "busy", fmt.Sprintf("wh_busy%d", i), "link.clicked")
	}
	addSubscription(t, db, "calm", "wh_calm", "link.clicked")
	if _, err := db.Exec(ctx, `ALTER TABLE webhook_deliveries ADD CONSTRAINT stuck CHECK (tenant <> 'busy')`); err != nil {
		t.Fatal(err)
	}

	rdb := &ackRecorder{}
	b := NewClickBatcher(Config{ClickGroup: "g", MaxPending: 100}, rdb, store, clickevent.StreamConfig{Shards: 1, MaxLen: 1000}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	batch := newClickBatch()
	now := time.Now()
	tenants := map[string]bool{"busy": true, "calm": true}
	batch.add("clicks:{0}", []redis.XMessage{
		click("1-0", "busy", "b1", now), click("2-0", "calm", "c1", now), click("3-0", "other", "o1", now),
	}, tenants, now)
	err := b.flush(ctx, batch)
	if err == nil {
		t.Error("the flush reported no failure, want the stuck tenant's")
	}
	if n := countDeliveries(t, db, "wh_calm"); n != 1 {
		t.Errorf("the calm tenant's subscription has %d deliveries, want its 1 while another tenant's queueing is stuck (flush: %v)", n, err)
	}
	slices.Sort(rdb.acked)
	if want := []string{"clicks:{0}/2-0", "clicks:{0}/3-0"}; !slices.Equal(rdb.acked, want) {
		t.Errorf("acknowledged %v, want %v: the calm tenant's click and the unsubscribed one, not the stuck tenant's", rdb.acked, want)
	}
}

// TestClickFlushSkipsASubscriptionWithAFullBacklog: link.clicked was
// queued behind any backlog. A receiver that never answers gets about 24
// attempts a minute from a replica (4 of its tenant's slots, 10 s each),
// while clicks on 1,000 of the tenant's links (anyone's to make) queued
// 10,000 deliveries a minute over 10 subscriptions: PostgreSQL grew by
// 14 million rows a day, nothing ever dead (that takes an attempt). A
// subscription with MaxPending pending deliveries must get no more
// link.clicked; another of the tenant's still gets its own.
func TestClickFlushSkipsASubscriptionWithAFullBacklog(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	store := NewStore(db, 2*time.Second)
	addSubscription(t, db, "acme", "wh_full", "link.clicked")
	addSubscription(t, db, "acme", "wh_ok", "link.clicked")
	addDeliveries(t, db, "wh_full", 100)
	addDeliveries(t, db, "wh_ok", 99)

	rdb := &ackRecorder{}
	b := NewClickBatcher(Config{ClickGroup: "g", MaxPending: 100}, rdb, store, clickevent.StreamConfig{Shards: 1, MaxLen: 1000},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	batch := newClickBatch()
	now := time.Now()
	batch.add("clicks:{0}", []redis.XMessage{click("1-0", "acme", "a1", now), click("2-0", "acme", "a2", now)},
		map[string]bool{"acme": true}, now)
	if err := b.flush(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if n := countDeliveries(t, db, "wh_full"); n != 100 {
		t.Errorf("the subscription with 100 pending has %d deliveries after the flush, want no more than its 100", n)
	}
	if n := countDeliveries(t, db, "wh_ok"); n != 101 {
		t.Errorf("the subscription with 99 pending has %d deliveries after the flush, want 101 (both links' clicks)", n)
	}
	if len(rdb.acked) != 2 {
		t.Errorf("acknowledged %v, want both entries (the skipped clicks are not owed)", rdb.acked)
	}
}

// A subscription marked backlogged (its link events are not queued) gets
// no link.clicked either, whatever its pending deliveries count now: the
// flush takes the mark as a full backlog instead of counting it again in
// every statement. The mark is cleared only below 90% of MaxPending.
func TestClickFlushSkipsABackloggedSubscriptionWithoutCounting(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	store := NewStore(db, 2*time.Second)
	addSubscription(t, db, "acme", "wh_marked", "link.clicked")
	addSubscription(t, db, "acme", "wh_ok", "link.clicked")
	addDeliveries(t, db, "wh_marked", 95)
	if _, err := db.Exec(ctx, `UPDATE webhook_subscriptions SET backlogged = true WHERE id = 'wh_marked'`); err != nil {
		t.Fatal(err)
	}

	rdb := &ackRecorder{}
	b := NewClickBatcher(Config{ClickGroup: "g", MaxPending: 100}, rdb, store, clickevent.StreamConfig{Shards: 1, MaxLen: 1000},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	batch := newClickBatch()
	now := time.Now()
	batch.add("clicks:{0}", []redis.XMessage{click("1-0", "acme", "a1", now)}, map[string]bool{"acme": true}, now)
	if err := b.flush(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if n := countDeliveries(t, db, "wh_marked"); n != 95 {
		t.Errorf("the backlogged subscription with 95 pending has %d deliveries after the flush, want its 95", n)
	}
	if n := countDeliveries(t, db, "wh_ok"); n != 1 {
		t.Errorf("the other subscription has %d deliveries after the flush, want the click's 1", n)
	}
}
