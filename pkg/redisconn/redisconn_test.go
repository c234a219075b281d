//go:build integration

package redisconn_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/redisconn"
)

func connect(t *testing.T) *redis.ClusterClient {
	t.Helper()
	var cfg redisconn.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	c, err := redisconn.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("local Redis Cluster (make up): %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// touchBoth increments two keys and stamps both with a TTL in one atomic
// script; the cluster accepts it only when both keys share a hash slot.
var touchBoth = redis.NewScript(`
local a = redis.call('INCR', KEYS[1])
local b = redis.call('INCRBY', KEYS[2], 10)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return {a, b}
`)

func TestClusterIsFormed(t *testing.T) {
	c := connect(t)
	ctx := context.Background()
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	covered := 0
	for _, s := range slots {
		covered += int(s.End-s.Start) + 1
		if len(s.Nodes) < 2 {
			t.Errorf("slots %d-%d have no replica: %v", s.Start, s.End, s.Nodes)
		}
	}
	if covered != 16384 {
		t.Errorf("slots covered: got %d, want 16384", covered)
	}
	if len(slots) < 3 {
		t.Errorf("slot ranges: got %d, want at least 3 (3 masters)", len(slots))
	}
}

func TestScriptTouchesTwoHashTaggedKeys(t *testing.T) {
	c := connect(t)
	ctx := context.Background()
	tenant := fmt.Sprintf("t%d", time.Now().UnixNano())
	keys := []string{"rl:{" + tenant + "}:key", "rl:{" + tenant + "}:tenant"}

	slotA, _ := c.ClusterKeySlot(ctx, keys[0]).Result()
	slotB, _ := c.ClusterKeySlot(ctx, keys[1]).Result()
	if slotA != slotB {
		t.Fatalf("hash-tagged keys in slots %d and %d, want one", slotA, slotB)
	}
	// Run uses EVALSHA and falls back to EVAL when the script cache is empty;
	// flush the cache on every master so the fallback is exercised.
	if err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return m.ScriptFlush(ctx).Err()
	}); err != nil {
		t.Fatal(err)
	}
	for i := int64(1); i <= 2; i++ {
		got, err := touchBoth.Run(ctx, c, keys, 60000).Int64Slice()
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		if got[0] != i || got[1] != 10*i {
			t.Errorf("run %d: got %v, want [%d %d]", i, got, i, 10*i)
		}
	}
	for _, k := range keys {
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil || ttl <= 0 || ttl > time.Minute {
			t.Errorf("PTTL %s: got %v (%v), want within (0, 60s]", k, ttl, err)
		}
	}
}

func TestScriptRefusesKeysInTwoSlots(t *testing.T) {
	c := connect(t)
	ctx := context.Background()
	// Without a shared hash tag these two keys land in different slots.
	keys := []string{"rl:a:crossslot", "rl:b:crossslot"}
	slotA, _ := c.ClusterKeySlot(ctx, keys[0]).Result()
	slotB, _ := c.ClusterKeySlot(ctx, keys[1]).Result()
	if slotA == slotB {
		t.Fatalf("test keys share slot %d; choose keys in different slots", slotA)
	}
	_, err := touchBoth.Run(ctx, c, keys, 1000).Result()
	if err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
		t.Fatalf("got %v, want a CROSSSLOT error", err)
	}
}

func TestSlotMatchesRedis(t *testing.T) {
	c := connect(t)
	for _, key := range []string{"rl:{t:acme}:api:per-key:k", "rl:{api:per-ip:1.2.3.4}", "plain", "{}", "a{b}c{d}", "x{}y", "clicks:{3.1}", "{", "}{a}"} {
		want, err := c.ClusterKeySlot(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := redisconn.Slot(key); int64(got) != want {
			t.Errorf("Slot(%q) = %d, Redis says %d", key, got, want)
		}
	}
}
