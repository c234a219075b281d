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
// Here a lock held on that tenant's subscription stands for its volume.
// The other tenant's delivery must be queued and its click acknowledged;
// the stuck tenant's click stays pending, to be claimed again.
func TestClickFlushOfOneTenantDoesNotHoldBackTheOthers(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	store := NewStore(db, 300*time.Millisecond)
	for i := range 10 {
		addSubscription(t, db, "busy", fmt.Sprintf("wh_busy%d", i), "link.clicked")
	}
	addSubscription(t, db, "calm", "wh_calm", "link.clicked")
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM webhook_subscriptions WHERE id = 'wh_busy3' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	rdb := &ackRecorder{}
	b := NewClickBatcher(Config{ClickGroup: "g"}, rdb, store, clickevent.StreamConfig{Shards: 1, MaxLen: 1000}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	batch := newClickBatch()
	now := time.Now()
	tenants := map[string]bool{"busy": true, "calm": true}
	batch.add("clicks:{0}", []redis.XMessage{
		click("1-0", "busy", "b1", now), click("2-0", "calm", "c1", now), click("3-0", "other", "o1", now),
	}, tenants, now)
	err = b.flush(ctx, batch)
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
