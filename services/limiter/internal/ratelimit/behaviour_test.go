//go:build integration

package ratelimit

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/testkit/metrictest"
	"kurz.dev/pkg/testkit/redistest"
	"kurz.dev/pkg/testkit/servertest"
)

// Two rules of one tenant share its hash tag and are decided by one script;
// a third rule on its own slot is decided in parallel and refunded.
const tenantRules = `
domains:
  api:
    rules:
      - {name: per-key, key: [tenant, api_key], shard: tenant, algorithm: token_bucket, limit: 5, window: 1h, failure_mode: open}
      - {name: per-tenant, key: [tenant], shard: tenant, algorithm: fixed_window, limit: 3, window: 1h, failure_mode: open}
      - {name: per-ip, key: [ip], algorithm: sliding_log, limit: 10, window: 1h, failure_mode: open}
`

func remaining(t *testing.T, e *Engine, desc map[string]string) map[string]int64 {
	t.Helper()
	out, err := e.Explain(context.Background(), "api", desc, 0)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	for _, r := range out.Rules {
		m[r.Decision.Rule] = r.Decision.Remaining
	}
	return m
}

func TestDenialConsumesNothingInTheOtherRules(t *testing.T) {
	e := engine(t, cluster(t), tenantRules, Options{})
	ctx := context.Background()
	desc := map[string]string{"tenant": unique(t), "api_key": "k1", "ip": unique(t)}

	_, rules := e.Rules().Match("api", desc)
	if rules[0].tag != rules[1].tag || rules[0].tag == rules[2].tag {
		t.Fatalf("hash tags %q %q %q: want the two tenant rules together and per-ip apart", rules[0].tag, rules[1].tag, rules[2].tag)
	}
	for i := range 3 {
		if !e.Check(ctx, "api", desc, 1).Allowed {
			t.Fatalf("request %d denied, want allowed (per-tenant allows 3)", i+1)
		}
	}
	before := remaining(t, e, desc)
	resp := e.Check(ctx, "api", desc, 1)
	if resp.Allowed || resp.DecidingRule != "per-tenant" || resp.RetryAfter.AsDuration() <= 0 {
		t.Fatalf("4th request: allowed=%v deciding=%q retry=%v, want denied by per-tenant with retry-after", resp.Allowed, resp.DecidingRule, resp.RetryAfter.AsDuration())
	}
	e.Wait() // the per-ip refund runs in the background
	after := remaining(t, e, desc)
	for _, rule := range []string{"per-key", "per-ip"} {
		if after[rule] != before[rule] {
			t.Errorf("%s: remaining %d before the denied request, %d after; want unchanged", rule, before[rule], after[rule])
		}
	}
	// The denial reports the other rules as they are, not as the request
	// would have left them.
	for _, d := range resp.Decisions {
		if d.Rule != "per-tenant" && (!d.Allowed || d.Remaining != before[d.Rule]) {
			t.Errorf("denied request's decision of %s: allowed=%v remaining %d, want allowed with %d (nothing consumed)", d.Rule, d.Allowed, d.Remaining, before[d.Rule])
		}
	}
	if before["per-key"] != 2 || before["per-ip"] != 7 {
		t.Errorf("remaining before: %v, want per-key 2 and per-ip 7", before)
	}
}

func TestSlidingLogRefundRemovesExactlyItsEntries(t *testing.T) {
	rdb := cluster(t)
	e := engine(t, rdb, tenantRules, Options{})
	ctx := context.Background()
	ip := unique(t)
	// Exhaust per-tenant for one tenant, then hit per-ip with cost 4 through
	// that tenant: the per-ip entries must be removed again.
	denyTenant := map[string]string{"tenant": unique(t), "api_key": "k", "ip": ip}
	for range 3 {
		e.Check(ctx, "api", map[string]string{"tenant": denyTenant["tenant"], "api_key": "k"}, 1)
	}
	if e.Check(ctx, "api", denyTenant, 4).Allowed {
		t.Fatal("want a denial by per-tenant")
	}
	e.Wait()
	n, err := rdb.ZCard(ctx, "rl:{api:per-ip:"+escapeValue(ip)+"}").Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("per-ip log holds %d entries after the refund, want 0", n)
	}
}

// A sliding log's entries go in and out 500 to a command: a cost across
// several such chunks adds and refunds exactly its units.
func TestSlidingLogLargeCostAddsAndRefundsEveryUnit(t *testing.T) {
	rdb := cluster(t)
	e := engine(t, rdb, `
domains:
  big:
    rules:
      - {name: log, key: [k], algorithm: sliding_log, limit: 1200, window: 1m, failure_mode: open}
      - {name: gate, key: [g], algorithm: fixed_window, limit: 1, window: 1m, failure_mode: open}
`, Options{})
	ctx := context.Background()
	card := func(k string) int64 {
		t.Helper()
		n, err := rdb.ZCard(ctx, "rl:{big:log:"+escapeValue(k)+"}").Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	x, y, g := unique(t), unique(t), unique(t)
	if resp := e.Check(ctx, "big", map[string]string{"k": x}, 1101); !resp.Allowed || resp.Remaining != 99 {
		t.Fatalf("cost 1101 of 1200: allowed=%v remaining=%d, want allowed with 99 left", resp.Allowed, resp.Remaining)
	}
	if n := card(x); n != 1101 {
		t.Errorf("log holds %d entries after a cost of 1101, want 1101", n)
	}
	if !e.Check(ctx, "big", map[string]string{"k": y, "g": g}, 1).Allowed {
		t.Fatal("first request through the gate denied")
	}
	if e.Check(ctx, "big", map[string]string{"k": y, "g": g}, 1101).Allowed {
		t.Fatal("want the gate to deny the second request")
	}
	e.Wait() // the log's refund runs in the background
	if n := card(y); n != 1 {
		t.Errorf("log holds %d entries after a refunded cost of 1101, want the first request's 1", n)
	}
}

func TestLeakyQueueAdmitsWithGrowingDelay(t *testing.T) {
	e := engine(t, cluster(t), demoRules, Options{})
	desc := map[string]string{"user": unique(t), "algo": "leaky_queue"}
	at := time.Now()
	var last time.Duration
	for i := range 100 {
		resp := e.CheckAt(context.Background(), at, "demo", desc, 1)
		if !resp.Allowed {
			t.Fatalf("request %d denied, want all 100 queued", i+1)
		}
		delay := resp.Decisions[0].Delay.AsDuration()
		// Drain rate 100/60 s: the i-th request waits for i ahead of it.
		if want := time.Duration(i) * 600 * time.Millisecond; delay != want {
			t.Fatalf("request %d: delay %v, want %v", i+1, delay, want)
		}
		last = delay
	}
	full := e.CheckAt(context.Background(), at, "demo", desc, 1)
	if full.Allowed || full.RetryAfter.AsDuration() != 600*time.Millisecond {
		t.Errorf("queue full: allowed=%v retry=%v, want denied, retry 600ms (one slot drains)", full.Allowed, full.RetryAfter.AsDuration())
	}
	if last != 99*600*time.Millisecond {
		t.Errorf("last delay %v", last)
	}
}

func TestShrinkingBurstClampsTokens(t *testing.T) {
	e := engine(t, cluster(t), `
domains:
  api:
    rules:
      - {name: per-key, key: [api_key], algorithm: token_bucket, limit: 1000, window: 1h, burst: 1000, failure_mode: open}
`, Options{})
	ctx := context.Background()
	desc := map[string]string{"api_key": unique(t)}
	if got := e.Check(ctx, "api", desc, 1).Remaining; got != 999 {
		t.Fatalf("remaining %d, want 999", got)
	}
	e.SetRules(compile(t, `
domains:
  api:
    rules:
      - {name: per-key, key: [api_key], algorithm: token_bucket, limit: 1000, window: 1h, burst: 10, failure_mode: open}
`))
	if got := e.Check(ctx, "api", desc, 1).Remaining; got != 9 {
		t.Errorf("after the burst shrank to 10: remaining %d, want 9 (min(burst, tokens) - 1)", got)
	}
	// A cost over the burst is never allowed: the decision says what the
	// rule holds at most, so that callers can tell it from a wait.
	over := e.Check(ctx, "api", desc, 11)
	if d := over.GetDecisions(); over.Allowed || len(d) != 1 || d[0].GetCapacity() != 10 || d[0].GetLimit() != 1000 {
		t.Errorf("cost 11 over a burst of 10: allowed %v, decisions %v; want denied, capacity 10, limit 1000", over.Allowed, d)
	}
}

func TestPeekConsumesNothing(t *testing.T) {
	e := engine(t, cluster(t), hourly, Options{})
	ctx := context.Background()
	for _, algo := range algos {
		desc := map[string]string{"user": unique(t), "algo": algo}
		e.Check(ctx, "t", desc, 3)
		for range 3 {
			if got := e.Check(ctx, "t", desc, 0); !got.Allowed || got.Remaining != 97 {
				t.Errorf("%s: peek allowed=%v remaining=%d, want true, 97", algo, got.Allowed, got.Remaining)
			}
		}
	}
}

func TestRecoversFromAFlushedScriptCache(t *testing.T) {
	rdb := cluster(t)
	for _, pipelined := range []bool{false, true} {
		t.Run(fmt.Sprintf("autopipeline=%v", pipelined), func(t *testing.T) {
			e := engine(t, rdb, hourly, Options{AutoPipeline: pipelined})
			ctx := context.Background()
			desc := map[string]string{"user": unique(t), "algo": "token_bucket"}
			e.Check(ctx, "t", desc, 1)
			if err := rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
				return m.ScriptFlush(ctx).Err()
			}); err != nil {
				t.Fatal(err)
			}
			resp := e.Check(ctx, "t", desc, 1)
			if !resp.Allowed || resp.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS || resp.Remaining != 98 {
				t.Errorf("after SCRIPT FLUSH: allowed=%v source=%v remaining=%d, want true, REDIS, 98", resp.Allowed, resp.Source, resp.Remaining)
			}
		})
	}
}

// The node pipelines (pipe.go) leave redirects and a lost script cache to
// the cluster client: with the slot map pointing every slot at one master
// and every script cache flushed, pipelined decisions are still decided on
// Redis, each exactly once.
func TestPipelinedDecisionsFollowRedirectsAndReloadTheScript(t *testing.T) {
	rdb := cluster(t)
	e := engine(t, rdb, hourly, Options{AutoPipeline: true})
	nodes := *e.slots.nodes.Load()
	one := nodes[0]
	for i := range nodes {
		nodes[i] = one
	}
	e.slots.nodes.Store(&nodes)
	ctx := context.Background()
	if err := rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return m.ScriptFlush(ctx).Err()
	}); err != nil {
		t.Fatal(err)
	}
	base := unique(t)
	for round, want := range []int64{99, 98} {
		var wg sync.WaitGroup
		for i := range 40 {
			wg.Go(func() {
				desc := map[string]string{"user": fmt.Sprintf("%s-%d", base, i), "algo": "token_bucket"}
				resp := e.Check(ctx, "t", desc, 1)
				if !resp.Allowed || resp.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS || resp.Remaining != want {
					t.Errorf("round %d, user %d: allowed=%v source=%v remaining=%d, want true, REDIS, %d", round, i, resp.Allowed, resp.Source, resp.Remaining, want)
				}
			})
		}
		wg.Wait()
	}
}

func TestDeniedKeysAreAnsweredFromMemoryUntilRetryAfter(t *testing.T) {
	rdb := cluster(t)
	e := engine(t, rdb, hourly, Options{})
	ctx := context.Background()
	desc := map[string]string{"user": unique(t), "algo": "fixed_window"}
	e.Check(ctx, "t", desc, 100)
	asked := time.Now()
	first := e.Check(ctx, "t", desc, 1)
	if first.Allowed {
		t.Fatal("want a denial")
	}
	// Delete the state: a Redis round trip would now allow; the cache must
	// still deny, exactly as Redis did.
	if err := rdb.Del(ctx, "rl:{t:fixed_window:"+desc["user"]+"}").Err(); err != nil {
		t.Fatal(err)
	}
	second := e.Check(ctx, "t", desc, 1)
	if second.Allowed || second.RetryAfter.AsDuration() <= 0 || second.RetryAfter.AsDuration() > first.RetryAfter.AsDuration() {
		t.Errorf("cached denial: allowed=%v retry=%v (first retry %v)", second.Allowed, second.RetryAfter.AsDuration(), first.RetryAfter.AsDuration())
	}
	// Its figures are Redis's counted down, not how long the cache keeps
	// it (a second at most): the hourly window's retry is minutes away.
	elapsed := time.Since(asked)
	for _, d := range []struct {
		name          string
		first, cached time.Duration
	}{
		{"retry_after", first.RetryAfter.AsDuration(), second.RetryAfter.AsDuration()},
		{"reset_after", first.ResetAfter.AsDuration(), second.ResetAfter.AsDuration()},
	} {
		if d.cached > d.first || d.cached < d.first-elapsed {
			t.Errorf("cached denial's %s %v, want within %v of Redis's %v", d.name, d.cached, elapsed, d.first)
		}
	}
}

// A denial in memory answers only a request of its own cost: a larger
// one is denied by Redis with its own, longer retry-after. A token bucket
// of 100 an hour: one token comes back in 36 s, ten in 6 min.
func TestACachedDenialAnswersOnlyItsOwnCost(t *testing.T) {
	rdb := cluster(t)
	e := engine(t, rdb, hourly, Options{})
	ctx := context.Background()
	desc := map[string]string{"user": unique(t), "algo": "token_bucket"}
	e.Check(ctx, "t", desc, 100)
	one := e.Check(ctx, "t", desc, 1)
	ten := e.Check(ctx, "t", desc, 10)
	if one.Allowed || ten.Allowed {
		t.Fatalf("an empty bucket allowed: cost 1 %v, cost 10 %v", one.Allowed, ten.Allowed)
	}
	if r1, r10 := one.RetryAfter.AsDuration(), ten.RetryAfter.AsDuration(); r1 > 36*time.Second || r10 < 5*time.Minute+50*time.Second {
		t.Errorf("retry-after %v for one token, %v for ten right after it; want at most 36s and about 6m", r1, r10)
	}
	if one.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS || ten.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
		t.Errorf("first denials of each cost: sources %v and %v, want REDIS", one.Source, ten.Source)
	}
	tenAgain := e.Check(ctx, "t", desc, 10)
	if tenAgain.Allowed || tenAgain.RetryAfter.AsDuration() > ten.RetryAfter.AsDuration() || tenAgain.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_OVER_LIMIT_CACHE {
		t.Errorf("cost 10 again: allowed=%v retry=%v source=%v, want its cached denial (%v at most, OVER_LIMIT_CACHE)", tenAgain.Allowed, tenAgain.RetryAfter.AsDuration(), tenAgain.Source, ten.RetryAfter.AsDuration())
	}
	again := e.Check(ctx, "t", desc, 1)
	if again.Allowed || again.RetryAfter.AsDuration() > one.RetryAfter.AsDuration() || again.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
		t.Errorf("cost 1 again: allowed=%v retry=%v source=%v, want Redis's denial (%v at most; the cached one is cost 10's)", again.Allowed, again.RetryAfter.AsDuration(), again.Source, one.RetryAfter.AsDuration())
	}
}

// When several rules denied a request, its repeat from the over-limit
// cache is decided, as on Redis, by the denial with the longest
// retry-after, not by the first rule in configuration order: a client
// told the shorter wait would come back only to be denied again.
func TestACachedDenialIsDecidedByTheLongestRetry(t *testing.T) {
	rdb := cluster(t)
	e := engine(t, rdb, `
domains:
  two:
    rules:
      - {name: per-second, key: [user], algorithm: fixed_window, limit: 1, window: 2s, failure_mode: open}
      - {name: per-hour, key: [user], algorithm: fixed_window, limit: 1, window: 1h, failure_mode: open}
`, Options{})
	ctx := context.Background()
	desc := map[string]string{"user": unique(t)}
	if first := e.Check(ctx, "two", desc, 1); !first.Allowed {
		t.Fatalf("first call denied: %+v", first)
	}
	onRedis := e.Check(ctx, "two", desc, 1)
	if onRedis.Allowed || onRedis.DecidingRule != "per-hour" || onRedis.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
		t.Fatalf("second call: allowed=%v deciding %q source %v, want per-hour's denial on Redis", onRedis.Allowed, onRedis.DecidingRule, onRedis.Source)
	}
	cached := e.Check(ctx, "two", desc, 1)
	if cached.Allowed || cached.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_OVER_LIMIT_CACHE {
		t.Fatalf("third call: allowed=%v source %v, want a cached denial", cached.Allowed, cached.Source)
	}
	if cached.DecidingRule != "per-hour" || cached.RetryAfter.AsDuration() < onRedis.RetryAfter.AsDuration()-time.Second {
		t.Errorf("cached denial decided by %q, retry %v; want per-hour's, about %v", cached.DecidingRule, cached.RetryAfter.AsDuration(), onRedis.RetryAfter.AsDuration())
	}
}

// When one rule denies, the rules that allowed consume nothing, and their
// figures say so: remaining and reset-after as a look right after the
// denial sees them (fresh keys: full, back to full in 0), not as they
// would have been had the request been admitted.
func TestAllowingRulesOfADenialReportTheirUnconsumedState(t *testing.T) {
	rdb := cluster(t)
	e := engine(t, rdb, `
domains:
  gated:
    rules:
      - {name: gate, key: [user], algorithm: fixed_window, limit: 1, window: 1h, failure_mode: open}
      - {name: bucket, key: [user, ip], algorithm: token_bucket, limit: 7, window: 10s, burst: 20, failure_mode: open}
      - {name: leaky, key: [user, ip], algorithm: leaky_bucket, limit: 7, window: 10s, burst: 20, failure_mode: open}
      - {name: window, key: [user, ip], algorithm: fixed_window, limit: 10, window: 1h, failure_mode: open}
      - {name: log, key: [user, ip], algorithm: sliding_log, limit: 10, window: 1h, failure_mode: open}
`, Options{})
	ctx := context.Background()
	user := unique(t)
	if first := e.Check(ctx, "gated", map[string]string{"user": user, "ip": "a"}, 1); !first.Allowed {
		t.Fatalf("first call denied: %+v", first)
	}
	desc := map[string]string{"user": user, "ip": "b"}
	denied := e.Check(ctx, "gated", desc, 1)
	if denied.Allowed || denied.DecidingRule != "gate" {
		t.Fatalf("second call: allowed=%v deciding %q, want gate's denial", denied.Allowed, denied.DecidingRule)
	}
	e.Wait() // the rules on other slots than gate's are given back in the background
	look := e.Check(ctx, "gated", desc, 0)
	for i, d := range denied.Decisions[1:] {
		l := look.Decisions[i+1]
		if !d.Allowed || d.Remaining != l.Remaining || d.Remaining != d.Capacity || d.ResetAfter.AsDuration() != 0 || l.ResetAfter.AsDuration() != 0 {
			t.Errorf("%s: allowed=%v remaining %d reset %v; a look after: remaining %d reset %v; want full (%d), reset 0",
				d.Rule, d.Allowed, d.Remaining, d.ResetAfter.AsDuration(), l.Remaining, l.ResetAfter.AsDuration(), d.Capacity)
		}
	}
	// A bucket that had consumed before: its reset counts down from where
	// it was, not from one request further, to the script's millisecond
	// (cost 2: a request of the cached denial's cost 1 would be answered
	// by gate's alone). 7 per 10 s: a unit's refill is no whole number of
	// milliseconds, which a full bucket must not show as a remainder.
	again := e.Check(ctx, "gated", map[string]string{"user": user, "ip": "a"}, 2)
	if again.Allowed || len(again.Decisions) != 5 {
		t.Fatalf("third call: allowed=%v with %d decisions, want gate's denial decided on Redis", again.Allowed, len(again.Decisions))
	}
	e.Wait()
	after := e.Check(ctx, "gated", map[string]string{"user": user, "ip": "a"}, 0)
	if d, l := again.Decisions[1], after.Decisions[1]; d.Remaining != l.Remaining || d.ResetAfter.AsDuration() < l.ResetAfter.AsDuration()-time.Millisecond || d.ResetAfter.AsDuration() > l.ResetAfter.AsDuration()+time.Second {
		t.Errorf("bucket after its own consume: denied call says remaining %d reset %v, a look after it %d and %v",
			d.Remaining, d.ResetAfter.AsDuration(), l.Remaining, l.ResetAfter.AsDuration())
	}
}

const failureRules = `
domains:
  f:
    rules:
      - {name: open, key: [user], match: {mode: open}, algorithm: token_bucket, limit: 10, window: 1h, failure_mode: open}
      - {name: closed, key: [user], match: {mode: closed}, algorithm: token_bucket, limit: 10, window: 1h, failure_mode: closed}
      - {name: local, key: [user], match: {mode: local}, algorithm: sliding_window_counter, limit: 10, window: 1h, failure_mode: local}
`

// privateCluster connects to a one-node cluster the test may stop.
func privateCluster(t *testing.T, node *redistest.Node, timeout time.Duration) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{node.Addr}, ContextTimeoutEnabled: true,
		DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestFailureModesWhenRedisIsDown(t *testing.T) {
	node := redistest.Start(t)
	const timeout = 100 * time.Millisecond
	e := engine(t, privateCluster(t, node, timeout), failureRules, Options{Timeout: timeout, Replicas: 2, BreakerThreshold: 3, BreakerCooldown: 200 * time.Millisecond})
	ctx := context.Background()
	user := unique(t)
	check := func(mode string) *ratelimitv1.CheckQuotaResponse {
		return e.Check(ctx, "f", map[string]string{"user": user, "mode": mode}, 1)
	}
	if got := check("open"); got.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
		t.Fatalf("healthy: source %v, want REDIS", got.Source)
	}

	node.Pause() // Redis hangs: every call must be cut at the timeout
	t.Cleanup(node.Resume)
	var slowest time.Duration
	timed := func(mode string) *ratelimitv1.CheckQuotaResponse {
		start := time.Now()
		resp := check(mode)
		slowest = max(slowest, time.Since(start))
		return resp
	}
	for range 5 {
		if got := timed("open"); !got.Allowed || got.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_OPEN {
			t.Errorf("open while Redis hangs: allowed=%v source=%v, want allowed FAIL_OPEN", got.Allowed, got.Source)
		}
		if got := timed("closed"); got.Allowed || got.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED {
			t.Errorf("closed while Redis hangs: allowed=%v source=%v, want denied FAIL_CLOSED", got.Allowed, got.Source)
		}
	}
	allowed := 0
	for range 20 {
		got := timed("local")
		if got.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_LOCAL_FALLBACK {
			t.Errorf("local while Redis hangs: source %v, want LOCAL_FALLBACK", got.Source)
		}
		if got.Allowed {
			allowed++
		}
	}
	if allowed != 5 {
		t.Errorf("local fallback allowed %d/20, want 5 (limit 10 / 2 replicas)", allowed)
	}
	// Generous bound: the point is "cut at the timeout", not a speed claim.
	if slowest > 20*timeout {
		t.Errorf("slowest decision while Redis hung took %v, want it bounded by the %v timeout", slowest, timeout)
	}

	node.Resume()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := check("closed")
		if got.Source == ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
			if !got.Allowed {
				t.Errorf("back on Redis: closed rule denied a fresh key")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %v 10s after Redis came back", got.Source)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Quotas are enforced again, not left open. (Sequential: the point is
	// the breaker closed, not throughput under a 100 ms timeout.)
	n := 0
	fresh := unique(t)
	for range 30 {
		if e.Check(ctx, "f", map[string]string{"user": fresh, "mode": "open"}, 1).Allowed {
			n++
		}
	}
	if n != 10 {
		t.Errorf("after recovery: allowed %d/30, want 10", n)
	}
}

func TestBreakerStopsPayingTheTimeout(t *testing.T) {
	node := redistest.Start(t)
	const timeout = 100 * time.Millisecond
	e := engine(t, privateCluster(t, node, timeout), failureRules, Options{Timeout: timeout, BreakerThreshold: 2, BreakerCooldown: time.Hour})
	node.Pause()
	t.Cleanup(node.Resume)
	desc := map[string]string{"user": unique(t), "mode": "open"}
	for range 2 { // open the breaker
		e.Check(context.Background(), "f", desc, 1)
	}
	start := time.Now()
	for range 20 {
		if got := e.Check(context.Background(), "f", desc, 1); got.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_OPEN {
			t.Fatalf("source %v, want FAIL_OPEN", got.Source)
		}
	}
	// 20 calls that each paid the timeout would take 2 s.
	if took := time.Since(start); took >= 20*timeout/2 {
		t.Errorf("20 decisions with the breaker open took %v: the timeout is still being paid", took)
	}
}

// A caller that gives up says nothing about Redis: decisions cut short by
// their callers' cancellation or deadline, however many, leave the breakers
// closed, and the next caller is decided on Redis.
func TestCallersGivingUpDoNotOpenTheBreaker(t *testing.T) {
	e := engine(t, cluster(t), failureRules, Options{Timeout: 5 * time.Second, BreakerThreshold: 2, BreakerCooldown: time.Hour})
	desc := map[string]string{"user": unique(t), "mode": "open"}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	late, cancelLate := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancelLate()
	for range 5 {
		e.Check(gone, "f", desc, 1)
		e.Check(late, "f", desc, 1)
	}
	if got := e.Check(context.Background(), "f", desc, 1); got.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
		t.Errorf("after 10 callers gave up: source %v, want REDIS (a breaker opened)", got.Source)
	}
}

// A caller that gives up while it holds the half-open breaker's one probe
// frees it: the next caller probes, and is decided on Redis. (The probe
// used to stay out for good, and the node's decisions went to the failure
// modes until it stopped being a master.) Check and CheckMany alike.
func TestAbandonedProbeDoesNotJamTheBreaker(t *testing.T) {
	rdb := cluster(t)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for name, check := range map[string]func(e *Engine, ctx context.Context, desc map[string]string) *ratelimitv1.CheckQuotaResponse{
		"Check": func(e *Engine, ctx context.Context, desc map[string]string) *ratelimitv1.CheckQuotaResponse {
			return e.Check(ctx, "f", desc, 1)
		},
		"CheckMany": func(e *Engine, ctx context.Context, desc map[string]string) *ratelimitv1.CheckQuotaResponse {
			return e.CheckMany(ctx, []Request{{Domain: "f", Desc: desc, Cost: 1}})[0]
		},
	} {
		t.Run(name, func(t *testing.T) {
			// Opened by one failure a minute ago for a second: half-open.
			e := engine(t, rdb, failureRules, Options{Timeout: 5 * time.Second, BreakerThreshold: 1, BreakerCooldown: time.Second, AutoPipeline: true})
			desc := map[string]string{"user": unique(t), "mode": "open"}
			_, rules := e.Rules().Match("f", desc)
			node := e.slots.node(rules[0].Key)
			then := time.Now().Add(-time.Minute)
			e.breakers.get(node).record(false, false, then, then)
			check(e, gone, desc) // takes the probe, gives up
			if got := check(e, context.Background(), desc); got.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
				t.Errorf("after an abandoned probe: source %v, want REDIS (the breaker is stuck half-open)", got.Source)
			}
		})
	}
}

// A request whose caller gave up before Redis answered is answered by the
// failure mode to no one: it is counted as abandoned, not as a decision or a
// fallback (which KurzLimiterFallingBack watches).
func TestAbandonedRequestsAreNotDecisions(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e, err := NewEngine(cluster(t), compile(t, failureRules), Options{Timeout: 5 * time.Second}, slog.New(slog.DiscardHandler), mp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Wait)
	desc := map[string]string{"user": unique(t), "mode": "open"}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for range 3 {
		e.Check(gone, "f", desc, 1)
	}
	if got := e.Check(context.Background(), "f", desc, 1); got.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
		t.Fatalf("live caller: source %v, want REDIS", got.Source)
	}
	abandoned := metrictest.Counter(t, reader, "kurz.ratelimit.abandoned")
	decisions := metrictest.Counter(t, reader, "kurz.ratelimit.decisions")
	fallbacks := metrictest.Counter(t, reader, "kurz.ratelimit.fallbacks")
	if abandoned != 3 || decisions != 1 || fallbacks != 0 {
		t.Errorf("abandoned %d, decisions %d, fallbacks %d; want 3, 1, 0", abandoned, decisions, fallbacks)
	}
}

// The deciding rule of an allowance is the one with the least headroom
// relative to what it can hold: a bucket's burst, not its per-window limit.
func TestDecidingRuleIsTheOneWithLeastHeadroom(t *testing.T) {
	e := engine(t, cluster(t), `
domains:
  api:
    rules:
      - {name: per-api-key, key: [api_key], algorithm: token_bucket, limit: 60, window: 1m, burst: 20, failure_mode: open}
      - {name: per-tenant, key: [tenant], algorithm: token_bucket, limit: 300, window: 1m, burst: 60, failure_mode: open}
`, Options{})
	resp := e.Check(context.Background(), "api", map[string]string{"api_key": unique(t), "tenant": unique(t)}, 1)
	// per-api-key: 19 of a 20 burst left (95%); per-tenant: 59 of 60 (98%).
	if resp.DecidingRule != "per-api-key" || resp.Remaining != 19 {
		t.Errorf("deciding %q remaining %d, want per-api-key with 19", resp.DecidingRule, resp.Remaining)
	}
}

// slowRedis is a client hook that, while on, delays every decision script by
// delay before it reaches Redis: a Redis that answers, but late. A caller's
// context still cuts the wait, as a context deadline cuts a socket read
// (ContextTimeoutEnabled). The node pipelines do not run the client's
// hooks: their deadline is TestPipeCallerStopsWaitingAtItsDeadline's.
// calls counts the scripts sent while slow.
type slowRedis struct {
	delay time.Duration
	on    atomic.Bool
	calls atomic.Int64
}

func (s *slowRedis) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *slowRedis) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := s.wait(ctx, cmd); err != nil {
			return err
		}
		return next(ctx, cmd)
	}
}

func (s *slowRedis) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := s.wait(ctx, cmds...); err != nil {
			return err
		}
		return next(ctx, cmds)
	}
}

func (s *slowRedis) wait(ctx context.Context, cmds ...redis.Cmder) error {
	if !s.on.Load() {
		return nil
	}
	n := 0
	for _, c := range cmds {
		if name := c.Name(); name == "evalsha" || name == "eval" {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	s.calls.Add(int64(n))
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A Redis that is slow rather than down must cost a decision no more than
// the timeout, auto-pipelined or not, and open the breaker as a dead one does.
// Through the cluster client the hook above makes it slow; the node
// pipelines run no hooks, so for them the node itself holds every script
// (CLIENT PAUSE WRITE).
func TestSlowRedisCostsNoMoreThanTheTimeout(t *testing.T) {
	for _, pipelined := range []bool{false, true} {
		t.Run(fmt.Sprintf("autopipeline=%v", pipelined), func(t *testing.T) {
			const timeout = 100 * time.Millisecond
			const threshold = 3
			node := redistest.Start(t)
			rdb := redis.NewClusterClient(&redis.ClusterOptions{
				Addrs: []string{node.Addr}, ContextTimeoutEnabled: true,
				// As the service sets them: longer than the timeout, so the
				// decision deadline, not a socket timeout, cuts a slow call.
				ReadTimeout: 10 * timeout, WriteTimeout: 10 * timeout,
			})
			t.Cleanup(func() { _ = rdb.Close() })
			slow := &slowRedis{delay: 4 * timeout}
			rdb.AddHook(slow)
			e := engine(t, rdb, failureRules, Options{
				Timeout: timeout, Replicas: 2, BreakerThreshold: threshold, BreakerCooldown: time.Hour,
				AutoPipeline: pipelined,
			})
			user := unique(t)
			check := func(mode string) (*ratelimitv1.CheckQuotaResponse, time.Duration) {
				start := time.Now()
				resp := e.Check(context.Background(), "f", map[string]string{"user": user, "mode": mode}, 1)
				return resp, time.Since(start)
			}
			// The first decision on the fresh node dials it and loads the
			// script, which under -race on a loaded machine can outlast the
			// 100 ms timeout: ask until Redis answers (a success resets the
			// breaker's count of consecutive failures).
			var got *ratelimitv1.CheckQuotaResponse
			if !servertest.Eventually(10*time.Second, func() bool {
				got, _ = check("open")
				return got.Source == ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS
			}) {
				t.Fatalf("healthy: source %v, want REDIS", got.Source)
			}

			if pipelined {
				pause := redis.NewClient(&redis.Options{Addr: node.Addr})
				defer pause.Close()
				if err := pause.Do(context.Background(), "CLIENT", "PAUSE", (20 * timeout).Milliseconds(), "WRITE").Err(); err != nil {
					t.Fatal(err)
				}
				defer func() { _ = pause.Do(context.Background(), "CLIENT", "UNPAUSE").Err() }()
			} else {
				slow.on.Store(true)
			}
			modes := []string{"open", "closed", "local"}
			want := map[string]ratelimitv1.DecisionSource{
				"open":   ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_OPEN,
				"closed": ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED,
				"local":  ratelimitv1.DecisionSource_DECISION_SOURCE_LOCAL_FALLBACK,
			}
			var breakerOpen time.Duration
			for i := range 4 * threshold {
				mode := modes[i%len(modes)]
				got, took := check(mode)
				if got.Source != want[mode] {
					t.Errorf("decision %d (%s) with Redis slow: source %v, want %v", i+1, mode, got.Source, want[mode])
				}
				// The margin is for a busy machine; the delay is twice as long.
				if took > 2*timeout {
					t.Errorf("decision %d (%s) took %v with Redis slow, want it cut at the %v timeout", i+1, mode, took, timeout)
				}
				if i >= threshold {
					breakerOpen += took
				}
			}
			if breakerOpen >= timeout {
				t.Errorf("%d decisions with the breaker open took %v: the timeout is still being paid", 3*threshold, breakerOpen)
			}

			if pipelined {
				return // a paused node drops a script whose connection went
			}
			// Close runs every abandoned script through the hook (a script
			// abandoned at its deadline still runs, as after a network
			// timeout), so the count below is final.
			_ = rdb.Close()
			if got := slow.calls.Load(); got != threshold {
				t.Errorf("%d scripts were sent to the slow Redis, want %d: the breaker opens after %d failures", got, threshold, threshold)
			}
		})
	}
}

// A refund lands after its window rolled over: the units it gives back were
// counted in the old window and must not be taken from the new window's
// count (for the sliding window counter: from `prev`, where they now are).
func TestRefundAfterRolloverLeavesTheNewWindowAlone(t *testing.T) {
	rdb := cluster(t)
	ctx := context.Background()
	const window = 60_000
	t1 := int64(1_800_000_000_000) / window * window // a window's start
	t1 += window - 1                                 // its last ms
	t2 := t1 + 2                                     // the next window
	for _, c := range []struct {
		name  string
		algo  int
		field string // the new window's own count
		want  map[string]string
	}{
		{"fixed window", 1, "n", map[string]string{"n": "1"}},
		{"sliding window counter", 3, "cur", map[string]string{"cur": "1", "prev": "0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := "rl:{test:" + unique(t) + "}"
			run := func(clock int64, mode, id string) []int64 {
				t.Helper()
				vals, err := decideScript.Run(ctx, rdb, []string{key}, clock, mode, id, c.algo, 10, window, 10, 1, 0).Int64Slice()
				if err != nil {
					t.Fatal(err)
				}
				return vals
			}
			first := run(t1, "check", "a") // consumed in the old window
			run(t2, "check", "b")          // the new window counts 1
			run(first[1], "refund", "a")   // the refund arrives late
			got, err := rdb.HGetAll(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			for f, v := range c.want {
				if got[f] != v {
					t.Errorf("%s after the late refund = %q, want %q (state %v)", f, got[f], v, got)
				}
			}
		})
	}
}

// A rule whose algorithm changes keeps its state key, where the old
// algorithm's state may be of another Redis type (a sliding log's sorted set,
// every other algorithm's hash). The new algorithm starts afresh on Redis
// instead of failing on the old state until it expires (an hour of the
// failure mode here), and ignores the old algorithm's fields even where
// their names are its own: in a single call, a batch, a peek, a lease and
// Explain, which shows the old state's algorithm until a write replaces it.
func TestAlgorithmChangeStartsAfresh(t *testing.T) {
	rule := func(algo, extra string) string {
		return `
domains:
  t:
    rules:
      - {name: per-user, key: [user], algorithm: ` + algo + `, limit: 100, window: 1h, failure_mode: closed` + extra + `}
`
	}
	const leased = ", lease: {size: 10, ttl: 1m}"
	rdb := cluster(t)
	ctx := context.Background()
	for _, from := range algos {
		for _, to := range algos {
			if from == to {
				continue
			}
			t.Run(from+"->"+to, func(t *testing.T) {
				e := engine(t, rdb, rule(from, ""), Options{AutoPipeline: true})
				single, batched, lease := unique(t), unique(t), unique(t)
				for _, u := range []string{single, batched, lease} {
					if resp := e.Check(ctx, "t", map[string]string{"user": u}, 2); !resp.Allowed || resp.Remaining != 98 {
						t.Fatalf("%s: allowed=%v remaining=%d, want true, 98", from, resp.Allowed, resp.Remaining)
					}
				}
				e.SetRules(compile(t, rule(to, "")))
				explained := func(want string) {
					t.Helper()
					x, err := e.Explain(ctx, "t", map[string]string{"user": single}, 1)
					if err != nil {
						t.Fatalf("explain under %s: %v", to, err)
					}
					if got := x.Rules[0].State["stale_state"]; got != want {
						t.Errorf("explain under %s: stale_state %q, want %q (state %v)", to, got, want, x.Rules[0].State)
					}
				}
				explained(from)
				fresh := func(what string, resp *ratelimitv1.CheckQuotaResponse, source ratelimitv1.DecisionSource, remaining int64) {
					t.Helper()
					if !resp.Allowed || resp.Source != source || resp.Remaining != remaining {
						t.Errorf("%s under %s: allowed=%v source=%v remaining=%d, want true, %v, %d",
							what, to, resp.Allowed, resp.Source, resp.Remaining, source, remaining)
					}
				}
				redis := ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS
				fresh("peek", e.Check(ctx, "t", map[string]string{"user": single}, 0), redis, 100)
				fresh("check", e.Check(ctx, "t", map[string]string{"user": single}, 1), redis, 99)
				fresh("second check", e.Check(ctx, "t", map[string]string{"user": single}, 1), redis, 98)
				explained("")
				resps := e.CheckMany(ctx, []Request{{Domain: "t", Desc: map[string]string{"user": batched}, Cost: 1}})
				fresh("batched check", resps[0], redis, 99)

				e.SetRules(compile(t, rule(to, leased)))
				fresh("leased check", e.Check(ctx, "t", map[string]string{"user": lease}, 1), ratelimitv1.DecisionSource_DECISION_SOURCE_LEASE, 99)
			})
		}
	}
}

// Switching back to an algorithm does not resume its old fields under the
// other algorithm's timestamp or window: A's state, exhausted, then B's
// written over it two hours later (`ts` and `w` are shared names), then A
// again must be a fresh key, not A's empty bucket refilled from B's `ts`.
func TestAlgorithmSwitchBackStartsAfresh(t *testing.T) {
	rule := func(algo string) string {
		return `
domains:
  t:
    rules:
      - {name: per-user, key: [user], algorithm: ` + algo + `, limit: 100, window: 1m, failure_mode: closed}
`
	}
	ctx := context.Background()
	rdb := cluster(t)
	for _, c := range [][2]string{{"fixed_window", "sliding_window_counter"}, {"sliding_window_counter", "fixed_window"},
		{"token_bucket", "leaky_bucket"}, {"leaky_bucket", "token_bucket"}} {
		a, b := c[0], c[1]
		t.Run(a+"->"+b+"->"+a, func(t *testing.T) {
			e := engine(t, rdb, rule(a), Options{})
			d := map[string]string{"user": unique(t)}
			t0 := time.UnixMilli(1_800_000_000_000 / 60_000 * 60_000) // a minute's start
			if r := e.CheckAt(ctx, t0, "t", d, 100); !r.Allowed {
				t.Fatalf("%s: the first 100 denied", a)
			}
			e.SetRules(compile(t, rule(b)))
			t1 := t0.Add(2 * time.Hour)
			if r := e.CheckAt(ctx, t1, "t", d, 1); !r.Allowed || r.Remaining != 99 {
				t.Fatalf("%s two hours later: allowed=%v remaining=%d, want true, 99", b, r.Allowed, r.Remaining)
			}
			e.SetRules(compile(t, rule(a)))
			if r := e.CheckAt(ctx, t1.Add(time.Millisecond), "t", d, 1); !r.Allowed || r.Remaining != 99 {
				t.Errorf("back to %s: allowed=%v remaining=%d retry=%v, want true, 99 (a fresh key)",
					a, r.Allowed, r.Remaining, r.RetryAfter.AsDuration())
			}
		})
	}
}

// A shadow rule that would deny consumes nothing, so when another rule of
// the request denies, it gets nothing back: the refund of the request must
// not credit the shadow rule with units it never took.
func TestShadowRuleThatWouldDenyIsNotRefunded(t *testing.T) {
	rules := func(trial string) string {
		return `
domains:
  t:
    rules:
      - {name: trial, key: [user], algorithm: ` + trial + `, limit: 1, window: 1h, failure_mode: closed, shadow: true}
      - {name: per-ip, key: [ip], algorithm: fixed_window, limit: 1, window: 1h, failure_mode: closed}
`
	}
	ctx := context.Background()
	rdb := cluster(t)
	for _, algo := range algos {
		t.Run(algo, func(t *testing.T) {
			e := engine(t, rdb, rules(algo), Options{})
			user, ip := unique(t), unique(t)
			if r := e.Check(ctx, "t", map[string]string{"user": user, "ip": ip}, 1); !r.Allowed {
				t.Fatal("first request denied")
			}
			// per-ip denies; trial would deny too (its 1 is used) and writes
			// nothing; the request's refund runs in the background.
			if r := e.Check(ctx, "t", map[string]string{"user": user, "ip": ip}, 1); r.Allowed {
				t.Fatal("second request allowed")
			}
			e.Wait()
			peek := e.Check(ctx, "t", map[string]string{"user": user}, 0)
			if len(peek.Decisions) != 1 || peek.Decisions[0].Remaining != 0 {
				t.Errorf("trial after the refund: %v, want 0 remaining (its 1 per hour used once)", peek.Decisions)
			}
		})
	}
}

// A lease taken under one algorithm and given back after the rule switched
// to another must leave the new algorithm's state alone: its give-back
// finds no state of its own algorithm and gives nothing.
func TestLeaseGivenBackAfterAnAlgorithmChangeKeepsTheNewState(t *testing.T) {
	rule := func(algo, lease string) string {
		return `
domains:
  t:
    rules:
      - {name: per-user, key: [user], algorithm: ` + algo + `, limit: 10, window: 1h, failure_mode: closed` + lease + `}
`
	}
	ctx := context.Background()
	rdb := cluster(t)
	for _, c := range [][2]string{{"token_bucket", "sliding_log"}, {"sliding_log", "token_bucket"}, {"token_bucket", "fixed_window"}, {"fixed_window", "sliding_window_counter"}} {
		from, to := c[0], c[1]
		t.Run(from+"->"+to, func(t *testing.T) {
			e := engine(t, rdb, rule(from, ", lease: {size: 5, ttl: 1m}"), Options{})
			d := map[string]string{"user": unique(t)}
			if r := e.Check(ctx, "t", d, 1); !r.Allowed || r.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_LEASE {
				t.Fatalf("first check: allowed=%v source=%v, want allowed from a lease", r.Allowed, r.Source)
			}
			e.SetRules(compile(t, rule(to, "")))
			allowed := 0
			for range 12 {
				if e.Check(ctx, "t", d, 1).Allowed {
					allowed++
				}
			}
			if allowed != 10 {
				t.Fatalf("%s: %d of 12 allowed, want 10", to, allowed)
			}
			// The old lease ends now: the engine gives back its 4 unused
			// units under the numbers it was taken under (as a replica
			// shutting down does).
			if err := e.ReturnLeases(ctx); err != nil {
				t.Fatal(err)
			}
			// A peek reads Redis (a check would be answered by the
			// over-limit cache).
			if r := e.Check(ctx, "t", d, 0); r.Remaining != 0 || r.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
				t.Errorf("%s after the old lease's give-back: remaining %d (source %v), want 0 on Redis: its 10 are used", to, r.Remaining, r.Source)
			}
		})
	}
}

// A limit lowered below what a key has already used reports no negative
// remaining (a plan downgrade): every algorithm, in a single call, a
// peek, a batch and a lease.
func TestALoweredLimitReportsNothingRemaining(t *testing.T) {
	rule := func(algo string, limit int, extra string) string {
		return fmt.Sprintf(`
domains:
  t:
    rules:
      - {name: per-user, key: [user], algorithm: %s, limit: %d, window: 1h, failure_mode: closed%s}
`, algo, limit, extra)
	}
	const leased = ", lease: {size: 2, ttl: 1m}"
	rdb := cluster(t)
	ctx := context.Background()
	for _, algo := range algos {
		for _, extra := range []string{"", leased} {
			t.Run(algo+extra, func(t *testing.T) {
				e := engine(t, rdb, rule(algo, 10, extra), Options{AutoPipeline: true})
				d := map[string]string{"user": unique(t)}
				for range 8 {
					if resp := e.Check(ctx, "t", d, 1); !resp.Allowed {
						t.Fatalf("call under the limit of 10 denied: %+v", resp)
					}
				}
				e.SetRules(compile(t, rule(algo, 3, extra)))
				for what, resp := range map[string]*ratelimitv1.CheckQuotaResponse{
					"check": e.Check(ctx, "t", d, 1),
					"peek":  e.Check(ctx, "t", d, 0),
					"batch": e.CheckMany(ctx, []Request{{Domain: "t", Desc: d, Cost: 1}})[0],
				} {
					// A token bucket keeps its 2 tokens (under the new 3);
					// every other algorithm counts 8 used against 3.
					if resp.Remaining < 0 || what != "peek" && algo != "token_bucket" && resp.Allowed {
						t.Errorf("%s after the limit went from 10 to 3 with 8 used: allowed=%v remaining=%d, want denied and 0 (token bucket and peek: allowed, >= 0)",
							what, resp.Allowed, resp.Remaining)
					}
				}
			})
		}
	}
}

// A look (cost 0) adds nothing, so its reset_after ("until back to full")
// is what the state says: 0 for a key with nothing counted, and for a
// sliding log the time until its newest entry leaves, not a whole window.
func TestALookReportsTheStatesReset(t *testing.T) {
	rdb := cluster(t)
	e := engine(t, rdb, hourly, Options{})
	ctx := context.Background()
	t0 := time.UnixMilli(1_800_000_000_000 / 3_600_000 * 3_600_000) // an hour's start
	for _, algo := range []string{"fixed_window", "sliding_log"} {
		d := map[string]string{"user": unique(t), "algo": algo}
		if r := e.CheckAt(ctx, t0.Add(time.Minute), "t", d, 0); r.ResetAfter.AsDuration() != 0 || r.Remaining != 100 {
			t.Errorf("%s: a look at a fresh key: reset %v remaining %d, want 0 and 100", algo, r.ResetAfter.AsDuration(), r.Remaining)
		}
		e.CheckAt(ctx, t0.Add(time.Minute), "t", d, 1)
		r := e.CheckAt(ctx, t0.Add(11*time.Minute), "t", d, 0)
		// Fixed window: the hour ends 49 min later; sliding log: the one
		// entry (1 min in) leaves 50 min later.
		want := map[string]time.Duration{"fixed_window": 49 * time.Minute, "sliding_log": 50 * time.Minute}[algo]
		if got := r.ResetAfter.AsDuration(); got != want || r.Remaining != 99 {
			t.Errorf("%s: a look 10 min after one request: reset %v remaining %d, want %v and 99", algo, got, r.Remaining, want)
		}
	}
}

// A request of Envoy's whose descriptors include an unlimited one is
// answered from the over-limit cache like any other: the unlimited
// descriptor's decision costs no Redis call, so it must not send every
// denial of the limited descriptor beside it back to Redis (the cache
// is what spares Redis a client hammering an exhausted key). The cached
// answer carries the unlimited decision too, so its descriptor still
// reports no limit.
func TestAnUnlimitedDescriptorLeavesTheOverLimitCacheAnswering(t *testing.T) {
	e := engine(t, cluster(t), `
domains:
  mixed:
    rules:
      - {name: per-ip, key: [ip], algorithm: fixed_window, limit: 1, window: 1h, failure_mode: open}
      - {name: per-user, key: [user], algorithm: fixed_window, limit: 100, window: 1h, failure_mode: open}
      - {name: vip, key: [user], match: {user: vip}, unlimited: true}
`, Options{})
	ctx := context.Background()
	descs := []map[string]string{{"user": "vip"}, {"ip": unique(t)}}
	costs := []int64{1, 1}
	if first, _ := e.CheckEach(ctx, "mixed", descs, costs); !first.Allowed {
		t.Fatalf("first request denied: %+v", first)
	}
	if second, _ := e.CheckEach(ctx, "mixed", descs, costs); second.Allowed || second.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
		t.Fatalf("second request: allowed=%v source %v, want per-ip's denial on Redis", second.Allowed, second.Source)
	}
	third, owners := e.CheckEach(ctx, "mixed", descs, costs)
	if third.Allowed || third.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_OVER_LIMIT_CACHE || third.DecidingRule != "per-ip" {
		t.Fatalf("third request: allowed=%v source %v deciding %q, want per-ip's denial from the over-limit cache", third.Allowed, third.Source, third.DecidingRule)
	}
	byRule := map[string][]int{}
	for i, d := range third.Decisions {
		byRule[d.Rule] = owners[i]
		if d.Rule == "vip" && (!d.Allowed || d.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_UNLIMITED) {
			t.Errorf("vip's decision %+v, want allowed, UNLIMITED", d)
		}
	}
	if len(byRule) != 2 || len(byRule["vip"]) != 1 || byRule["vip"][0] != 0 || len(byRule["per-ip"]) != 1 || byRule["per-ip"][0] != 1 {
		t.Errorf("decisions by rule with their descriptors %v, want vip for descriptor 0 and per-ip for 1", byRule)
	}
}

// Redis TIME steps back when a slot fails over to a node whose clock is
// behind, or when NTP steps a master's clock. A window already counted in
// must not start afresh: every algorithm holds its limit across a 2 ms step
// back over a window's start, and after it.
func TestAClockSteppedBackDoesNotReopenAWindow(t *testing.T) {
	rule := func(algo string) string {
		return `
domains:
  t:
    rules:
      - {name: per-user, key: [user], algorithm: ` + algo + `, limit: 10, window: 1m, failure_mode: closed}
`
	}
	ctx := context.Background()
	rdb := cluster(t)
	start := time.UnixMilli(1_800_000_000_000 / 60_000 * 60_000) // a minute's start
	for _, algo := range algos {
		t.Run(algo, func(t *testing.T) {
			e := engine(t, rdb, rule(algo), Options{})
			d := map[string]string{"user": unique(t)}
			if r := e.CheckAt(ctx, start, "t", d, 10); !r.Allowed {
				t.Fatal("the first 10 denied")
			}
			for _, at := range []time.Duration{-2 * time.Millisecond, 5 * time.Millisecond} {
				if r := e.CheckAt(ctx, start.Add(at), "t", d, 1); r.Allowed {
					t.Errorf("%v from the window's start, the clock having stepped back: allowed with %d left, want denied", at, r.Remaining)
				}
			}
		})
	}
}
