//go:build integration

package ratelimit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

// Concurrent decisions over many keys, every algorithm: batched by node,
// each request is still decided exactly as on its own (100 of 130 per key).
func TestBatchedDecisionsAreExactPerKey(t *testing.T) {
	e := engine(t, cluster(t), hourly, Options{Batch: true})
	var descs []map[string]string
	for i := range 40 * 5 {
		descs = append(descs, map[string]string{"user": fmt.Sprintf("%s-%d", unique(t), i/5), "algo": algos[i%5]})
	}
	burstOnRedis(t, e, descs, 130)
	if e.batch.batched.Load() == 0 {
		t.Errorf("no decision went in a batch of two or more: the test did not exercise batching")
	}
}

// A batch runs where its first key lives; a request whose key another node
// serves (a slot that moved) is not decided there but marked, before it
// writes anything, and the others are decided.
func TestBatchScriptMarksKeysOfAnotherNode(t *testing.T) {
	rdb := cluster(t)
	ctx := context.Background()
	here, there := keysOnTwoNodes(t, rdb, unique(t))
	req := func(key string) []any {
		return []any{1, key, "", "check", "r1", int(ratelimitv1.Algorithm_ALGORITHM_FIXED_WINDOW), 10, 60_000, 10, 1, 0}
	}
	args := append([]any{3}, req(here)...)
	args = append(args, req(there)...)
	args = append(args, req(here)...)
	vals, err := batchScript.Run(ctx, rdb, []string{here}, args...).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(vals) != 3*7 {
		t.Fatalf("reply of %d values, want 21: %v", len(vals), vals)
	}
	first, second, third := vals[0:7], vals[7:14], vals[14:21]
	if first[0] != 1 || first[3] != 9 || third[0] != 1 || third[3] != 8 {
		t.Errorf("requests on the batch's node: %v and %v, want allowed with 9 then 8 left", first, third)
	}
	if second[0] != -1 {
		t.Errorf("request of another node's key: %v, want all_allowed -1 (not decided here)", second)
	}
	if n, err := rdb.Exists(ctx, there).Result(); err != nil || n != 0 {
		t.Errorf("the other node's key exists (%d, %v): the marked request wrote", n, err)
	}
}

// An engine whose slot map is wrong (every slot on one node, as after a
// reshard it has not seen yet) batches keys of several nodes together: the
// ones the batch's node does not serve go again on their own, and every
// decision is still made on Redis, exactly.
func TestBatchesWithAStaleSlotMapStillDecideOnRedis(t *testing.T) {
	rdb := cluster(t)
	e := engine(t, rdb, hourly, Options{Batch: true})
	// Every slot on one master: a stale map. The first batch that meets
	// another node's key reloads it, so make that reload find the same
	// stale map until the test is done.
	var nodes [slotCount]string
	addr := e.slots.node(fmt.Sprint(0))
	for i := range nodes {
		nodes[i] = addr
	}
	e.slots.nodes.Store(&nodes)
	e.refreshing.Store(true)
	var descs []map[string]string
	for i := range 30 {
		descs = append(descs, map[string]string{"user": fmt.Sprintf("%s-%d", unique(t), i), "algo": "fixed_window"})
	}
	burstOnRedis(t, e, descs, 110)
	if e.batch.rerouted.Load() == 0 {
		t.Errorf("no request was sent again on its own: the test did not exercise a stale map")
	}
}

// burstOnRedis sends calls concurrent requests for each of descs (rules of
// limit 100 in the hourly rules) at one instant, all at once: each must be
// decided on Redis, and exactly 100 of each desc's allowed.
func burstOnRedis(t *testing.T, e *Engine, descs []map[string]string, calls int) {
	t.Helper()
	at := time.Now()
	allowed := make([]atomic.Int64, len(descs))
	var wg sync.WaitGroup
	for i, desc := range descs {
		for range calls {
			wg.Go(func() {
				resp := e.CheckAt(context.Background(), at, "t", desc, 1)
				if resp.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
					t.Errorf("%v: decided by %v, want REDIS", desc, resp.Source)
				}
				if resp.Allowed {
					allowed[i].Add(1)
				}
			})
		}
	}
	wg.Wait()
	for i := range allowed {
		if got := allowed[i].Load(); got != 100 {
			t.Errorf("%v: allowed %d/%d, want 100", descs[i], got, calls)
		}
	}
}

// keysOnTwoNodes returns two keys that different masters serve.
func keysOnTwoNodes(t *testing.T, rdb *redis.ClusterClient, prefix string) (string, string) {
	t.Helper()
	var m slotMap
	if err := m.refresh(context.Background(), rdb, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	first := prefix + "-0"
	for i := 1; i < 1000; i++ {
		k := fmt.Sprintf("%s-%d", prefix, i)
		if m.node(k) != m.node(first) {
			return first, k
		}
	}
	t.Fatal("no two keys on different masters in 1,000: is the cluster one node?")
	return "", ""
}
