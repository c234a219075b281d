package ratelimit

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
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
