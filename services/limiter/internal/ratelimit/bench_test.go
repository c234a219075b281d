//go:build integration

package ratelimit

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkCheck measures one decision through the engine on the local
// cluster (token bucket, 10,000 keys, parallel callers). Compare against
// BenchmarkPing, a bare PING on the same cluster, in the same run.
func BenchmarkCheck(b *testing.B) {
	for _, pipelined := range []bool{false, true} {
		name := "direct"
		if pipelined {
			name = "autopipeline"
		}
		b.Run(name, func(b *testing.B) {
			e := engine(b, cluster(b), hourly, Options{AutoPipeline: pipelined})
			users := make([]map[string]string, 10000)
			run := unique(b)
			for i := range users {
				users[i] = map[string]string{"user": run + strconv.Itoa(i), "algo": "token_bucket"}
			}
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					e.Check(context.Background(), "t", users[n.Add(1)%int64(len(users))], 1)
				}
			})
		})
	}
}

// BenchmarkPing is the baseline: one PING round trip to a cluster node.
func BenchmarkPing(b *testing.B) {
	rdb := cluster(b)
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rdb.Ping(context.Background())
		}
	})
}

// BenchmarkMemoryPerKey reports the Redis memory of one active key of each
// algorithm after 100 requests within its window (MEMORY USAGE): the notes'
// point about sliding logs, measured. Baseline: a plain counter key (what
// INCR-based fixed windows store).
func BenchmarkMemoryPerKey(b *testing.B) {
	rdb := cluster(b)
	e := engine(b, rdb, hourly, Options{})
	ctx := context.Background()
	measure := func(key string) float64 {
		n, err := rdb.MemoryUsage(ctx, key).Result()
		if err != nil {
			b.Fatal(err)
		}
		return float64(n)
	}
	b.Run("baseline-counter", func(b *testing.B) {
		key := "bench:counter:{" + unique(b) + "}"
		for range 100 {
			rdb.Incr(ctx, key)
		}
		rdb.Expire(ctx, key, time.Minute)
		for range b.N {
			b.ReportMetric(measure(key), "bytes/key")
		}
	})
	for _, algo := range algos {
		b.Run(algo, func(b *testing.B) {
			desc := map[string]string{"user": unique(b), "algo": algo}
			for range 100 {
				e.Check(ctx, "t", desc, 1)
			}
			_, rules := e.Rules().Match("t", desc)
			for range b.N {
				b.ReportMetric(measure(rules[0].Key), "bytes/key")
			}
		})
	}
}

// BenchmarkDecisionVsEvalsha compares a full engine decision (rule match,
// auto-pipelined script, response) with its ceiling, Baseline: the same Lua
// script called directly with EVALSHA on the same cluster, at the same
// concurrency (goroutines: 2, 16, 64, 256 on two cores), over 100,000
// keys (token bucket).
func BenchmarkDecisionVsEvalsha(b *testing.B) {
	rdb := cluster(b)
	e := engine(b, rdb, hourly, Options{AutoPipeline: true})
	run := unique(b)
	const keys = 100_000
	users := make([]map[string]string, keys)
	for i := range users {
		users[i] = map[string]string{"user": run + strconv.Itoa(i), "algo": "token_bucket"}
	}
	evalsha := Baseline(rdb, e.Rules().Rules("t")[0])
	for _, want := range []int{1, 16, 64, 256} {
		// RunParallel runs parallelism x GOMAXPROCS goroutines.
		parallelism := max(1, want/runtime.GOMAXPROCS(0))
		c := parallelism * runtime.GOMAXPROCS(0)
		b.Run(fmt.Sprintf("c=%d/evalsha", c), func(b *testing.B) {
			var n atomic.Int64
			b.SetParallelism(parallelism)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := evalsha(context.Background(), users[n.Add(1)%keys]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
		b.Run(fmt.Sprintf("c=%d/engine", c), func(b *testing.B) {
			var n atomic.Int64
			b.SetParallelism(parallelism)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					e.Check(context.Background(), "t", users[n.Add(1)%keys], 1)
				}
			})
		})
	}
}

// BenchmarkLeasedHotKey measures one hot key (every call the same key) at
// 32 goroutines, auto-pipelined as the service runs: first the rule decided
// on Redis, then the same rule leased (each lease 100 units, taken in one
// script call; the other callers draw from memory). The limit is far above
// what either reaches, so no call is a cached denial. bench.sh prints the
// ratio of the two.
func BenchmarkLeasedHotKey(b *testing.B) {
	const rules = `
domains:
  hot:
    rules:
      - {name: redis, key: [user], match: {mode: redis}, algorithm: token_bucket, limit: 1000000000, window: 1h, failure_mode: open}
      - {name: leased, key: [user], match: {mode: leased}, algorithm: token_bucket, limit: 1000000000, window: 1h, failure_mode: open, lease: {size: 100, ttl: 1s}}
`
	const callers = 32
	parallelism := max(1, callers/runtime.GOMAXPROCS(0))
	c := parallelism * runtime.GOMAXPROCS(0)
	for _, mode := range []string{"redis", "leased"} {
		b.Run(fmt.Sprintf("c=%d/%s", c, mode), func(b *testing.B) {
			e := engine(b, cluster(b), rules, Options{AutoPipeline: true, Replicas: 3})
			b.Cleanup(func() { _ = e.ReturnLeases(context.Background()) })
			desc := map[string]string{"user": unique(b), "mode": mode}
			var denied atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(parallelism)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if !e.Check(context.Background(), "hot", desc, 1).Allowed {
						denied.Add(1)
					}
				}
			})
			if n := denied.Load(); n > 0 {
				b.Errorf("%d calls denied: the limit must stay out of reach", n)
			}
		})
	}
}
