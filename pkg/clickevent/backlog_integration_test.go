//go:build integration

package clickevent

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// A group that fell behind a stream trimmed to 5 entries, then caught up:
// Redis 7 until redis/redis#13958 keeps reporting the lag it had;
// the backlog says 0, then the 3 entries added after.
func TestBacklogOfAGroupTheTrimOverran(t *testing.T) {
	ctx := context.Background()
	rdb := clusterClient(t)
	key := "test-backlog:{" + t.Name() + "}"
	rdb.Del(ctx, key)
	t.Cleanup(func() { rdb.Del(context.Background(), key) })
	add := func(n int) {
		for range n {
			if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, MaxLen: 5, Values: []string{"f", "v"}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	readAll := func() {
		if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{key, ">"}, Count: 100, Block: -1}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.XGroupCreateMkStream(ctx, key, "g", "$").Err(); err != nil {
		t.Fatal(err)
	}
	lags := NewLags(rdb, "g")
	check := func(step string, wantUnread int64, wantCaughtUp bool) Backlog {
		t.Helper()
		b, ok, err := lags.Read(ctx, key)
		if err != nil || !ok {
			t.Fatalf("%s: %v, ok=%v", step, err, ok)
		}
		if b.Unread != wantUnread || b.CaughtUp != wantCaughtUp {
			t.Errorf("%s: unread %d caught up %v (Redis's lag %d), want %d, %v", step, b.Unread, b.CaughtUp, b.RedisLag, wantUnread, wantCaughtUp)
		}
		return b
	}
	add(1)
	readAll()
	check("read the first entry", 0, true)
	add(20)
	if b := check("20 added, 15 trimmed unread", 5, false); !b.Overrun {
		t.Errorf("20 added, 15 trimmed unread: not an overrun")
	}
	readAll()
	if b := check("caught up", 0, true); b.RedisLag != 0 {
		t.Logf("Redis reports a lag of %d for a caught-up group (redis/redis#13958)", b.RedisLag)
	}
	add(3)
	if b := check("3 added", 3, false); b.Overrun {
		t.Errorf("3 added: an overrun, want none")
	}
	// TotalBacklog is 0 only once everything is read and acknowledged; a
	// stream that does not exist adds nothing.
	readAll()
	keys := []string{key, key + "-none"}
	if n, err := TotalBacklog(ctx, rdb, keys, "g"); err != nil || n == 0 {
		t.Errorf("read, unacknowledged: total backlog %d, %v; want the pending entries", n, err)
	}
	pending, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: key, Group: "g", Start: "-", End: "+", Count: 100}).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pending {
		rdb.XAck(ctx, key, "g", p.ID)
	}
	if n, err := TotalBacklog(ctx, rdb, keys, "g"); err != nil || n != 0 {
		t.Errorf("all acknowledged: total backlog %d, %v; want 0", n, err)
	}
	if _, ok, err := ReadBacklog(ctx, rdb, key, "nobody"); err != nil || ok {
		t.Errorf("unknown group: ok=%v err=%v, want not ok", ok, err)
	}
	if _, ok, err := ReadBacklog(ctx, rdb, key+"-none", "g"); err != nil || ok {
		t.Errorf("unknown stream: ok=%v err=%v, want not ok", ok, err)
	}
}
