//go:build integration

package ratelimit

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/testkit/metrictest"
)

// cluster connects to the shared local Redis Cluster (make up / make test).
func cluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	var cfg redisconn.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	// Longer than the engines' timeout, as the service configures it: the
	// context deadline, not a socket timeout, must cut a slow call.
	cfg.ReadTimeout, cfg.WriteTimeout = 10*time.Second, 10*time.Second
	c, err := redisconn.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("local Redis Cluster: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// meteredEngine is engine with its metrics collected: batches(outcome) is
// kurz.ratelimit.batch.requests of that outcome so far.
func meteredEngine(t testing.TB, rdb *redis.ClusterClient, rules string, opts Options) (e *Engine, batches func(outcome string) int64) {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	reader := sdkmetric.NewManualReader()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	e, err := NewEngine(rdb, compile(t, rules), opts, log, sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Wait)
	return e, func(outcome string) int64 {
		return metrictest.Counter(t, reader, "kurz.ratelimit.batch.requests", "outcome", outcome)
	}
}

func engine(t testing.TB, rdb *redis.ClusterClient, rules string, opts Options) *Engine {
	t.Helper()
	if opts.Timeout == 0 {
		// Generous: exactness must not depend on a busy CI machine meeting a
		// production-grade timeout (the failure tests set their own).
		opts.Timeout = 5 * time.Second
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	e, err := NewEngine(rdb, compile(t, rules), opts, log, noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Wait)
	return e
}

// unique returns a descriptor value no other test run uses.
func unique(t testing.TB) string {
	return fmt.Sprintf("%s-%d", strings.NewReplacer("/", "-").Replace(t.Name()), time.Now().UnixNano())
}

const hourly = `
domains:
  t:
    rules:
      - {name: token_bucket, key: [user], match: {algo: token_bucket}, algorithm: token_bucket, limit: 100, window: 1h, failure_mode: open}
      - {name: fixed_window, key: [user], match: {algo: fixed_window}, algorithm: fixed_window, limit: 100, window: 1h, failure_mode: open}
      - {name: sliding_window_counter, key: [user], match: {algo: sliding_window_counter}, algorithm: sliding_window_counter, limit: 100, window: 1h, failure_mode: open}
      - {name: sliding_log, key: [user], match: {algo: sliding_log}, algorithm: sliding_log, limit: 100, window: 1h, failure_mode: open}
      - {name: leaky_bucket, key: [user], match: {algo: leaky_bucket}, algorithm: leaky_bucket, limit: 100, window: 1h, failure_mode: open}
`

var algos = []string{"token_bucket", "fixed_window", "sliding_window_counter", "sliding_log", "leaky_bucket"}

// The notes' race: 500 concurrent requests, one user, limit 100. Every
// algorithm allows exactly 100, at one fixed instant (so nothing refills
// during the burst).
func TestConcurrentBurstAllowsExactlyTheLimit(t *testing.T) {
	rdb := cluster(t)
	for _, pipelined := range []bool{false, true} {
		e := engine(t, rdb, hourly, Options{AutoPipeline: pipelined})
		t.Run(fmt.Sprintf("autopipeline=%v", pipelined), func(t *testing.T) { burst(t, e) })
	}
}

func burst(t *testing.T, e *Engine) {
	at := time.Now()
	for _, algo := range algos {
		t.Run(algo, func(t *testing.T) {
			desc := map[string]string{"user": unique(t), "algo": algo}
			var allowed atomic.Int64
			var wg sync.WaitGroup
			for range 500 {
				wg.Go(func() {
					if e.CheckAt(context.Background(), at, "t", desc, 1).Allowed {
						allowed.Add(1)
					}
				})
			}
			wg.Wait()
			if got := allowed.Load(); got != 100 {
				t.Errorf("allowed %d/500, want 100/500", got)
			}
			next := e.CheckAt(context.Background(), at, "t", desc, 1)
			if next.Allowed || next.RetryAfter.AsDuration() <= 0 {
				t.Errorf("next call: allowed=%v retry_after=%v, want denied with a positive retry-after", next.Allowed, next.RetryAfter.AsDuration())
			}
		})
	}
}

// The notes' figures for the Lua token bucket (burst 100, 10 tokens/s).
func TestTokenBucketFiguresFromTheNotes(t *testing.T) {
	rdb := cluster(t)
	e := engine(t, rdb, `
domains:
  race:
    rules:
      - {name: token_bucket, key: [user], algorithm: token_bucket, limit: 10, window: 1s, burst: 100, failure_mode: local}
`, Options{})
	ctx := context.Background()
	desc := map[string]string{"user": unique(t)}
	t0 := time.Now()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 500 {
		wg.Go(func() {
			if e.CheckAt(ctx, t0, "race", desc, 1).Allowed {
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 100 {
		t.Fatalf("burst: allowed %d/500, want 100/500", allowed.Load())
	}
	next := e.CheckAt(ctx, t0, "race", desc, 1)
	if next.Allowed || next.Remaining != 0 || next.RetryAfter.AsDuration() != 100*time.Millisecond {
		t.Errorf("next call: allowed=%v tokens_left=%d retry_after=%v, want false, 0, 100ms (one token at 10/s)",
			next.Allowed, next.Remaining, next.RetryAfter.AsDuration())
	}
	allowed.Store(0)
	t1 := t0.Add(time.Second)
	for range 50 {
		wg.Go(func() {
			if e.CheckAt(ctx, t1, "race", desc, 1).Allowed {
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 10 {
		t.Errorf("after 1 s at 10 tokens/s: allowed %d/50, want 10/50", allowed.Load())
	}

	key := "rl:{race:token_bucket:" + desc["user"] + "}"
	state, err := rdb.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(state) != 4 || state["a"] != "4" || state["tokens"] == "" || state["ts"] != fmt.Sprint(t1.UnixMilli()) || state["b"] != "100" {
		t.Errorf("state %v: want exactly {a: 4, tokens, ts, b: 100} with ts=%d", state, t1.UnixMilli())
	}
	pttl, err := rdb.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Time to refill 100 tokens at 10/s, plus one second.
	if pttl <= 10*time.Second || pttl > 11*time.Second {
		t.Errorf("PTTL %v, want within (10s, 11s]", pttl)
	}
}

// The notes' boundary trace: limit 100 per 60 s; 100 requests spread over
// second 59, 100 spread over second 60, 100 at second 90.
func TestBoundaryTraceFromTheNotes(t *testing.T) {
	e := engine(t, cluster(t), demoRules, Options{})
	want := map[string][2]int{
		"fixed_window":           {200, 0},
		"sliding_log":            {100, 0},
		"sliding_window_counter": {102, 48},
		"token_bucket":           {103, 48},
		// As a meter, the leaky bucket is the token bucket's mirror image:
		// same admissions; it smooths only in queue mode (see the queue test).
		"leaky_bucket": {103, 48},
	}
	// Minute-aligned origin far from now, unique per run, so windows line
	// up as in the notes and no earlier run's keys interfere.
	base := time.UnixMilli((time.Now().UnixMilli()/60000 - 1000) * 60000)
	for algo, w := range want {
		t.Run(algo, func(t *testing.T) {
			desc := map[string]string{"user": unique(t), "algo": algo}
			boundary, later := 0, 0
			for _, sec := range []int{59, 60} {
				for i := range 100 {
					at := base.Add(time.Duration(sec)*time.Second + time.Duration(i)*10*time.Millisecond)
					if e.CheckAt(context.Background(), at, "demo", desc, 1).Allowed {
						boundary++
					}
				}
			}
			for range 100 {
				if e.CheckAt(context.Background(), base.Add(90*time.Second), "demo", desc, 1).Allowed {
					later++
				}
			}
			if boundary != w[0] || later != w[1] {
				t.Errorf("allowed in 59-61s: %d | at t=90s: %d; want %d | %d", boundary, later, w[0], w[1])
			}
		})
	}
}

const demoRules = `
domains:
  demo:
    defaults: {algo: token_bucket}
    rules:
      - {name: token_bucket, key: [user], match: {algo: token_bucket}, algorithm: token_bucket, limit: 100, window: 60s, burst: 100, failure_mode: local}
      - {name: fixed_window, key: [user], match: {algo: fixed_window}, algorithm: fixed_window, limit: 100, window: 60s, failure_mode: local}
      - {name: sliding_window_counter, key: [user], match: {algo: sliding_window_counter}, algorithm: sliding_window_counter, limit: 100, window: 60s, failure_mode: local}
      - {name: sliding_log, key: [user], match: {algo: sliding_log}, algorithm: sliding_log, limit: 100, window: 60s, failure_mode: local}
      - {name: leaky_bucket, key: [user], match: {algo: leaky_bucket}, algorithm: leaky_bucket, limit: 100, window: 60s, burst: 100, failure_mode: local}
      - {name: leaky_queue, key: [user], match: {algo: leaky_queue}, algorithm: leaky_bucket, limit: 100, window: 60s, burst: 100, queue: true, failure_mode: local}
`

func TestKeySlotMatchesRedis(t *testing.T) {
	rdb := cluster(t)
	for _, key := range []string{"rl:{t:acme}:api:per-key:k", "rl:{api:per-ip:1.2.3.4}", "plain", "{}", "a{b}c{d}", "x{}y"} {
		want, err := rdb.ClusterKeySlot(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := keySlot(key); int64(got) != want {
			t.Errorf("keySlot(%q) = %d, Redis says %d", key, got, want)
		}
	}
}

// KURZ_REDIS_PASSWORD set for a Redis Cluster without one: go-redis's
// connections are let in (HELLO as the default user, who takes any
// password), and the engine's own pipelines must be too, or every decision
// went to its rule's failure mode while the startup check passed.
func TestAPasswordARedisDoesNotAskForDecidesOnRedis(t *testing.T) {
	var cfg redisconn.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Password = "a-password-this-redis-does-not-ask-for"
	rdb, err := redisconn.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("the startup check refused the password: %v", err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	e := engine(t, rdb, hourly, Options{AutoPipeline: true})
	resp := e.Check(context.Background(), "t", map[string]string{"algo": "token_bucket", "user": unique(t)}, 1)
	if !resp.GetAllowed() || resp.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
		t.Errorf("decision: allowed %v, source %v; want allowed, decided on Redis", resp.GetAllowed(), resp.GetSource())
	}
}
