//go:build integration

package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/testkit/redistest"
)

// Many concurrent CheckMany calls over keys of every node and algorithm,
// each key's requests spread over the calls: batched by node, each request
// is still decided exactly as on its own (100 of 130 per key), on Redis.
func TestCheckManyIsExactPerKey(t *testing.T) {
	e, batches := meteredEngine(t, cluster(t), hourly, Options{AutoPipeline: true})
	var descs []map[string]string
	for i := range 20 * len(algos) {
		descs = append(descs, map[string]string{"user": fmt.Sprintf("%s-%d", unique(t), i/len(algos)), "algo": algos[i%len(algos)]})
	}
	checkManyOnRedis(t, e, descs, 130)
	if batches("batched") == 0 {
		t.Errorf("no request was decided in a batch: the test did not exercise batching")
	}
}

// An engine whose slot map is wrong (every slot on one master, as after a
// reshard it has not seen yet) batches keys of several nodes together: the
// ones the batch's node does not serve are decided again on their own, and
// every decision is still made on Redis, exactly.
func TestCheckManyWithAStaleSlotMapStillDecidesOnRedis(t *testing.T) {
	e, batches := meteredEngine(t, cluster(t), hourly, Options{AutoPipeline: true})
	nodes := *e.slots.nodes.Load()
	for i := range nodes {
		nodes[i] = nodes[0]
	}
	e.slots.nodes.Store(&nodes) // Run is not running: nothing reloads it
	var descs []map[string]string
	for i := range 30 {
		descs = append(descs, map[string]string{"user": fmt.Sprintf("%s-%d", unique(t), i), "algo": "fixed_window"})
	}
	checkManyOnRedis(t, e, descs, 110)
	if batches("rerouted") == 0 {
		t.Errorf("no request was decided again on its own: the test did not exercise a stale map")
	}
}

// checkManyOnRedis sends calls requests for each of descs (rules of limit
// 100 in the hourly rules), shuffled, 100 to a CheckMany call, the calls
// concurrent: each must be decided on Redis, and exactly 100 of each desc's
// allowed.
func checkManyOnRedis(t *testing.T, e *Engine, descs []map[string]string, calls int) {
	t.Helper()
	var reqs []int // indexes into descs
	for i := range descs {
		for range calls {
			reqs = append(reqs, i)
		}
	}
	rand.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	allowed := make([]int, len(descs))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for start := 0; start < len(reqs); start += 100 {
		chunk := reqs[start:min(start+100, len(reqs))]
		wg.Go(func() {
			batch := make([]Request, len(chunk))
			for j, i := range chunk {
				batch[j] = Request{Domain: "t", Desc: descs[i], Cost: 1}
			}
			resps := e.CheckMany(context.Background(), batch)
			mu.Lock()
			defer mu.Unlock()
			for j, resp := range resps {
				if resp.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS && resp.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_OVER_LIMIT_CACHE {
					t.Errorf("%v: decided by %v, want REDIS (or its over-limit cache)", descs[chunk[j]], resp.Source)
				}
				if resp.Allowed {
					allowed[chunk[j]]++
				}
			}
		})
	}
	wg.Wait()
	for i, n := range allowed {
		if n != 100 {
			t.Errorf("%v: allowed %d/%d, want 100", descs[i], n, calls)
		}
	}
}

// One CheckMany call answers each kind of request as Check would: no rule,
// a peek, a denial (and then from the over-limit cache), and three requests
// of one key in one batch, each counted.
func TestCheckManyAnswersEachAsCheckWould(t *testing.T) {
	e := engine(t, cluster(t), hourly, Options{AutoPipeline: true})
	ctx := context.Background()
	user := func(algo string) map[string]string { return map[string]string{"user": unique(t), "algo": algo} }
	full, peeked, counted := user("fixed_window"), user("token_bucket"), user("sliding_window_counter")
	if resp := e.Check(ctx, "t", full, 100); !resp.Allowed {
		t.Fatalf("setup: 100 units of a fresh key denied")
	}
	resps := e.CheckMany(ctx, []Request{
		{Domain: "t", Desc: map[string]string{"user": "u", "algo": "none"}, Cost: 1},
		{Domain: "t", Desc: peeked, Cost: 0},
		{Domain: "t", Desc: full, Cost: 1},
		{Domain: "t", Desc: counted, Cost: 1},
		{Domain: "t", Desc: counted, Cost: 1},
		{Domain: "t", Desc: counted, Cost: 1},
		{Domain: "t", Desc: full, Cost: 1},
	})
	if r := resps[0]; !r.Allowed || r.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_NO_RULE {
		t.Errorf("no rule: allowed=%v source=%v, want allowed NO_RULE", r.Allowed, r.Source)
	}
	if r := resps[1]; !r.Allowed || r.Remaining != 100 {
		t.Errorf("peek: allowed=%v remaining=%d, want allowed with 100", r.Allowed, r.Remaining)
	}
	for _, i := range []int{2, 6} {
		if r := resps[i]; r.Allowed || r.RetryAfter.AsDuration() <= 0 || r.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
			t.Errorf("request %d of a full key: allowed=%v retry_after=%v source=%v, want denied with a retry-after, REDIS", i, r.Allowed, r.RetryAfter.AsDuration(), r.Source)
		}
	}
	left := map[int64]bool{}
	for _, r := range resps[3:6] {
		if !r.Allowed {
			t.Errorf("one of three units of a fresh key denied")
		}
		left[r.Remaining] = true
	}
	if !left[99] || !left[98] || !left[97] {
		t.Errorf("three requests of one key left %v, want 99, 98 and 97: each counted once", left)
	}
	if r := e.Check(ctx, "t", peeked, 1); r.Remaining != 99 {
		t.Errorf("after the peek, a unit leaves %d, want 99: the peek consumed", r.Remaining)
	}
}

// A node that lost its script cache (restart, failover, SCRIPT FLUSH) gets
// the batch script again, within the call: the batch is decided on Redis.
func TestCheckManyReloadsAFlushedScript(t *testing.T) {
	rdb := cluster(t)
	e, batches := meteredEngine(t, rdb, hourly, Options{AutoPipeline: true})
	ctx := context.Background()
	if err := rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return m.ScriptFlush(ctx).Err()
	}); err != nil {
		t.Fatal(err)
	}
	desc := map[string]string{"user": unique(t), "algo": "token_bucket"}
	resps := e.CheckMany(ctx, []Request{{Domain: "t", Desc: desc, Cost: 1}, {Domain: "t", Desc: desc, Cost: 1}})
	for i, r := range resps {
		if !r.Allowed || r.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS || r.Remaining != int64(99-i) {
			t.Errorf("request %d after SCRIPT FLUSH: allowed=%v source=%v remaining=%d, want true, REDIS, %d", i, r.Allowed, r.Source, r.Remaining, 99-i)
		}
	}
	if batches("batched") != 2 {
		t.Errorf("%d requests decided in a batch, want 2", batches("batched"))
	}
}

// While a slot migrates, a batch whose first key the source node no longer
// holds is not followed to the importing node: there ASKING would let the
// script read the slot's other keys, still on the source, as if they did
// not exist. Each request goes on its own instead, and a key at its limit
// on the source stays denied.
func TestCheckManyDuringASlotMigration(t *testing.T) {
	rdb := cluster(t)
	ctx := context.Background()
	e, batches := meteredEngine(t, rdb, hourly, Options{AutoPipeline: true})
	desc := func(user string) map[string]string { return map[string]string{"user": user, "algo": "fixed_window"} }
	key := func(user string) string {
		_, rules := e.Rules().Match("t", desc(user))
		return rules[0].Key
	}
	stamp := fmt.Sprint(time.Now().UnixNano())
	full := "full-" + stamp
	slot := keySlot(key(full))
	var fresh string // a user whose key is in the same slot
	for i := 0; fresh == ""; i++ {
		if u := fmt.Sprintf("fresh-%s-%d", stamp, i); keySlot(key(u)) == slot {
			fresh = u
		}
	}
	if !e.Check(ctx, "t", desc(full), 100).Allowed {
		t.Fatal("setup: 100 units of a fresh key denied")
	}

	src := e.slots.node(key(full))
	var dst string // another master
	for _, n := range e.slots.nodes.Load() {
		if n != src && n != "" {
			dst = n
			break
		}
	}
	if dst == "" {
		t.Fatal("no second master: is the cluster one node?")
	}
	srcC, dstC := redis.NewClient(&redis.Options{Addr: src}), redis.NewClient(&redis.Options{Addr: dst})
	t.Cleanup(func() { _, _ = srcC.Close(), dstC.Close() })
	srcID, dstID := srcC.ClusterMyID(ctx).Val(), dstC.ClusterMyID(ctx).Val()
	if err := dstC.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// What the importing node took while the slot moved goes, then the
		// move ends with the slot where it was.
		conn := dstC.Conn()
		defer conn.Close()
		for _, u := range []string{fresh, full} {
			conn.Do(ctx, "ASKING")
			conn.Del(ctx, key(u))
		}
		for _, c := range []*redis.Client{srcC, dstC} {
			if err := c.Do(ctx, "CLUSTER", "SETSLOT", slot, "STABLE").Err(); err != nil {
				t.Errorf("slot %d left migrating on %s: %v", slot, c.Options().Addr, err)
			}
		}
	})
	if err := srcC.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(); err != nil {
		t.Fatal(err)
	}

	resps := e.CheckMany(ctx, []Request{{Domain: "t", Desc: desc(fresh), Cost: 1}, {Domain: "t", Desc: desc(full), Cost: 1}})
	if r := resps[0]; !r.Allowed || r.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
		t.Errorf("a fresh key during the migration: allowed=%v source=%v, want allowed, REDIS", r.Allowed, r.Source)
	}
	if r := resps[1]; r.Allowed || r.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
		t.Errorf("a key at its limit on the source node: allowed=%v source=%v, want denied, REDIS", r.Allowed, r.Source)
	}
	if batches("rerouted") == 0 {
		t.Errorf("no request was decided again on its own: the batch ran")
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

// keysOnTwoNodes returns two keys that different masters serve.
func keysOnTwoNodes(t *testing.T, rdb *redis.ClusterClient, prefix string) (string, string) {
	t.Helper()
	var m slotMap
	if _, err := m.refresh(context.Background(), rdb, 5*time.Second); err != nil {
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

// While Redis hangs, a batch is cut at the decision timeout and each of its
// requests gets its rule's failure mode, as a single call would.
func TestCheckManyFailureModesWhenRedisHangs(t *testing.T) {
	node := redistest.Start(t)
	const timeout = 100 * time.Millisecond
	e, batches := meteredEngine(t, privateCluster(t, node, timeout), failureRules, Options{
		Timeout: timeout, Replicas: 2, BreakerThreshold: 3, BreakerCooldown: time.Hour, AutoPipeline: true,
	})
	ctx := context.Background()
	user := unique(t)
	reqs := func(modes ...string) []Request {
		out := make([]Request, len(modes))
		for i, m := range modes {
			out[i] = Request{Domain: "f", Desc: map[string]string{"user": user, "mode": m}, Cost: 1}
		}
		return out
	}
	for _, r := range e.CheckMany(ctx, reqs("open", "closed")) {
		if r.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
			t.Fatalf("healthy: source %v, want REDIS", r.Source)
		}
	}
	if batches("batched") != 2 {
		t.Fatalf("healthy: %d requests decided in a batch, want 2", batches("batched"))
	}

	node.Pause()
	t.Cleanup(node.Resume)
	start := time.Now()
	resps := e.CheckMany(ctx, reqs("open", "closed", "local", "local", "local", "local", "local", "local"))
	if took := time.Since(start); took > 20*timeout {
		t.Errorf("a batch while Redis hung took %v, want it cut at the %v timeout", took, timeout)
	}
	if r := resps[0]; !r.Allowed || r.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_OPEN {
		t.Errorf("open while Redis hangs: allowed=%v source=%v, want allowed FAIL_OPEN", r.Allowed, r.Source)
	}
	if r := resps[1]; r.Allowed || r.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED {
		t.Errorf("closed while Redis hangs: allowed=%v source=%v, want denied FAIL_CLOSED", r.Allowed, r.Source)
	}
	allowed := 0
	for _, r := range resps[2:] {
		if r.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_LOCAL_FALLBACK {
			t.Errorf("local while Redis hangs: source %v, want LOCAL_FALLBACK", r.Source)
		}
		if r.Allowed {
			allowed++
		}
	}
	if allowed != 5 {
		t.Errorf("local fallback allowed %d/6, want 5 (limit 10 / 2 replicas)", allowed)
	}
}
