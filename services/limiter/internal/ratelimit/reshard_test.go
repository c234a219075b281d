//go:build integration

package ratelimit

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/redisconn"
)

// Two rules of one tenant under one hash tag: one script on two keys.
const splitRules = `
domains:
  reshard:
    rules:
      - {name: per-key, key: [tenant, api_key], shard: tenant, algorithm: fixed_window, limit: 10, window: 1h, failure_mode: closed}
      - {name: per-tenant, key: [tenant], shard: tenant, algorithm: fixed_window, limit: 10, window: 1h, failure_mode: closed}
`

// onTryAgain calls fn once, after the first command a node refused with
// TRYAGAIN: added after redisconn's hooks, it sees each attempt.
type onTryAgain struct {
	fn   func()
	done atomic.Bool
}

func (h *onTryAgain) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *onTryAgain) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if redis.IsTryAgainError(err) && h.done.CompareAndSwap(false, true) {
			h.fn()
		}
		return err
	}
}

func (h *onTryAgain) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A decision whose two keys a slot migration has split between the source
// and the importing node (Redis answers TRYAGAIN, having run nothing) is
// sent again until they are together, instead of answering by the rules'
// failure mode (closed: denied) for as long as the move takes. Through the
// limiter's own client (redisconn.NoRetries), on its pipelines and on the
// cluster client's path.
func TestADecisionOnKeysASlotMigrationSplitWaitsForThem(t *testing.T) {
	for _, pipelined := range []bool{true, false} {
		t.Run(map[bool]string{true: "pipelined", false: "cluster client"}[pipelined], func(t *testing.T) {
			testSplitDecision(t, pipelined)
		})
	}
}

func testSplitDecision(t *testing.T, pipelined bool) {
	var cfg redisconn.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rdb, err := redisconn.New(ctx, cfg, redisconn.NoRetries, redisconn.SocketTimeouts(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	e := engine(t, rdb, splitRules, Options{Timeout: 5 * time.Second, AutoPipeline: pipelined})
	desc := map[string]string{"tenant": unique(t), "api_key": "k1"}
	if r := e.Check(ctx, "reshard", desc, 1); !r.Allowed || r.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
		t.Fatalf("setup: allowed=%v source=%v, want allowed by Redis", r.Allowed, r.Source)
	}
	_, rules := e.Rules().Match("reshard", desc)
	keyA, keyB := rules[0].Key, rules[1].Key
	slot := keySlot(keyA)

	src := e.slots.node(keyA)
	var dst string // another master
	for _, n := range e.slots.nodes.Load() {
		if n != src && n != "" {
			dst = n
			break
		}
	}
	if dst == "" || src == anyNode {
		t.Fatalf("masters %q and %q: want two", src, dst)
	}
	srcC, dstC := redis.NewClient(&redis.Options{Addr: src}), redis.NewClient(&redis.Options{Addr: dst})
	t.Cleanup(func() { _, _ = srcC.Close(), dstC.Close() })
	srcID, dstID := srcC.ClusterMyID(ctx).Val(), dstC.ClusterMyID(ctx).Val()
	migrate := func(from *redis.Client, to string, keys ...string) error {
		host, port, _ := net.SplitHostPort(to)
		args := []any{"MIGRATE", host, port, "", 0, 5000, "REPLACE", "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		return from.Do(ctx, args...).Err()
	}
	// The shared cluster's slot ends where it was: the source owns it
	// again, every key the importing node took (ours, and any other test's
	// created meanwhile) goes back to it (MIGRATE's RESTORE-ASKING is
	// refused by a node still migrating the slot), and the importing node
	// forgets the move.
	t.Cleanup(func() {
		if err := srcC.Do(ctx, "CLUSTER", "SETSLOT", slot, "STABLE").Err(); err != nil {
			t.Errorf("slot %d left migrating on %s: %v", slot, src, err)
		}
		keys, err := dstC.ClusterGetKeysInSlot(ctx, slot, 1000).Result()
		if err != nil {
			t.Errorf("keys of slot %d on %s: %v", slot, dst, err)
		}
		if len(keys) > 0 {
			if err := migrate(dstC, src, keys...); err != nil {
				t.Errorf("keys of slot %d left on %s: %v", slot, dst, err)
			}
		}
		if err := dstC.Do(ctx, "CLUSTER", "SETSLOT", slot, "STABLE").Err(); err != nil {
			t.Errorf("slot %d left importing on %s: %v", slot, dst, err)
		}
	})
	if err := dstC.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := srcC.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := migrate(srcC, dst, keyA); err != nil {
		t.Fatal(err)
	}
	// The first TRYAGAIN moves the other key: the move's next batch.
	moved := &onTryAgain{fn: func() {
		if err := migrate(srcC, dst, keyB); err != nil {
			t.Errorf("migrate %s: %v", keyB, err)
		}
	}}
	rdb.AddHook(moved)

	r := e.Check(ctx, "reshard", desc, 1)
	if !moved.done.Load() {
		t.Fatal("no TRYAGAIN: the keys were not split, the test tested nothing")
	}
	if !r.Allowed || r.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
		t.Fatalf("decision on keys split by a slot migration: allowed=%v source=%v, want allowed by Redis once they are together", r.Allowed, r.Source)
	}
	for _, d := range r.Decisions {
		if d.Remaining != 8 {
			t.Errorf("%s: %d left, want 8 (2 of 10 used, each once)", d.Rule, d.Remaining)
		}
	}
}
