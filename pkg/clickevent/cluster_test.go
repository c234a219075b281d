//go:build integration

package clickevent

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"kurz.dev/pkg/redisconn"
)

// TestStreamKeysSpreadOverMasters asks the local Redis Cluster where the
// shard keys live.
func TestStreamKeysSpreadOverMasters(t *testing.T) {
	ctx := context.Background()
	rdb := clusterClient(t)
	ranges, err := rdb.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	masterOf := func(slot int) string {
		for _, r := range ranges {
			if slot >= int(r.Start) && slot <= int(r.End) {
				return r.Nodes[0].Addr
			}
		}
		return ""
	}
	masters := map[string]bool{}
	for _, r := range ranges {
		masters[r.Nodes[0].Addr] = true
	}

	for _, n := range []int{1, 3, 8, 16, MaxShards} {
		keys := StreamKeys(n)
		slotsSeen := map[int]bool{}
		perMaster := map[string]int{}
		for i, k := range keys {
			want, err := rdb.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got := redisconn.Slot(k); int64(got) != want {
				t.Fatalf("redisconn.Slot(%q) = %d, Redis says %d", k, got, want)
			}
			if lo, hi := i*16384/n, (i+1)*16384/n; int(want) < lo || int(want) >= hi {
				t.Errorf("n=%d: %s in slot %d, want [%d,%d)", n, k, want, lo, hi)
			}
			slotsSeen[int(want)] = true
			perMaster[masterOf(int(want))]++
		}
		if len(slotsSeen) != n {
			t.Errorf("n=%d: %d distinct slots, want %d", n, len(slotsSeen), n)
		}
		if n >= len(masters) && len(perMaster) != len(masters) {
			t.Errorf("n=%d: shards on %d of %d masters (%v), want all", n, len(perMaster), len(masters), perMaster)
		}
		if n == 8 {
			t.Logf("8 shards: %v, per master %v", keys, perMaster)
		}
	}
}

// clusterClient is a client of the local Redis Cluster, closed when the
// test ends.
func clusterClient(t *testing.T) *redis.ClusterClient {
	t.Helper()
	rdb, err := redisconn.New(context.Background(), redisconn.Config{
		Addrs:       []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"},
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, PoolSize: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}
