//go:build integration

package app

import (
	"context"

	"github.com/jackc/pgx/v5"
	"strconv"
	"sync/atomic"
	"testing"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
)

// BenchmarkCreateLink measures CreateLink over gRPC in-process against the
// real PostgreSQL and Redis (a fake limiter that allows everything), and
// reports the PostgreSQL statements per link: sequential codes should cost
// one INSERT per link plus one nextval per block of 1,000.
func BenchmarkCreateLink(b *testing.B) {
	for _, mode := range []shortenerv1.CodeMode{shortenerv1.CodeMode_CODE_MODE_SEQUENTIAL, shortenerv1.CodeMode_CODE_MODE_RANDOM} {
		b.Run(mode.String(), func(b *testing.B) {
			all := &queryCounter{substr: ""}
			nextvals := &queryCounter{substr: "nextval('link_block')"}
			inst := start(b, nil, hooks{pgTracer: tracers{all, nextvals}})
			tenant := uniq("bench-")
			stores(b, inst.cfg, tenant)
			ctx := as(tenant, "198.51.100.7")
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					_, err := inst.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{
						LongUrl: "https://example.com/bench/" + strconv.FormatInt(n.Add(1), 10), Mode: mode,
					})
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			links := float64(n.Load())
			b.ReportMetric(float64(all.n.Load())/links, "pg-statements/link")
			b.ReportMetric(float64(nextvals.n.Load())*1000/links, "nextval/1000-links")
		})
	}
}

// tracers fans one pgx tracer hook out to several.
type tracers []*queryCounter

func (ts tracers) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	for _, t := range ts {
		ctx = t.TraceQueryStart(ctx, c, d)
	}
	return ctx
}

func (ts tracers) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// BenchmarkBatchCreateLinks measures BatchCreateLinks of 1,000 sequential
// links, and reports the PostgreSQL statements per link: one multi-row
// INSERT per batch and at most one nextval round trip per batch (one block
// of 1,000 covers it).
func BenchmarkBatchCreateLinks(b *testing.B) {
	const size = 1000
	all := &queryCounter{substr: ""}
	nextvals := &queryCounter{substr: "nextval('link_block')"}
	inst := start(b, nil, hooks{pgTracer: tracers{all, nextvals}})
	tenant := uniq("benchb-")
	stores(b, inst.cfg, tenant)
	ctx := as(tenant, "198.51.100.8")
	reqs := make([]*shortenerv1.CreateLinkRequest, size)
	for i := range reqs {
		reqs[i] = &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/bench/" + strconv.Itoa(i)}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, err := inst.api.BatchCreateLinks(ctx, &shortenerv1.BatchCreateLinksRequest{Requests: reqs})
		if err != nil || resp.GetCreated() != size {
			b.Fatalf("batch: created %d, %v", resp.GetCreated(), err)
		}
	}
	b.StopTimer()
	links := float64(b.N * size)
	b.ReportMetric(float64(all.n.Load())/links, "pg-statements/link")
	b.ReportMetric(float64(nextvals.n.Load())*1000/links, "nextval/1000-links")
}
