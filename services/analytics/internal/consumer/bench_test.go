//go:build integration

package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/metrictest"
	"kurz.dev/services/analytics/internal/clickstore"
)

// Sizes of one throughput run: the production batch size, and ten batches.
const (
	benchEvents = 50_000
	benchBatch  = 5000
)

// BenchmarkConsumerThroughput measures events per second from the streams
// into ClickHouse, acknowledged: 50,000 events (200 links, 10,000 visitors,
// one bot in ten) are appended beforehand in the producer's format, then 1, 2
// or 4 consumers of one group, with the production batch settings (5,000
// events or 1 s), drain them. The limiter is an in-process fake; with
// KURZ_BENCH_LIMITER_ADDR set (e.g. 127.0.0.1:9091 after make up) the
// consumers are measured against that limiter as well. A drain usually ends
// with a partial batch per consumer that flushes by age: up to 1 s of each
// run is that wait, as after any burst.
//
// The baseline, baseline-direct-insert, is the ceiling the consumers are
// compared with: the same 50,000 events turned into the same rows (parsed
// and classified as the consumer does), inserted through clickstore's batch
// insert in batches of 5,000, one after the other, with nothing else to do
// (no reads, flood checks, first-visit marks or acknowledgements). Every
// sub-benchmark moves 50,000 events per op, so ns/op compare directly too;
// the consumer lines report x-baseline, their events/s over the baseline's
// of the same run (when it ran).
//
//	KURZ_CLICKHOUSE_DATABASE=kurz_test go test -tags integration -run '^$' -bench ConsumerThroughput -benchtime 3x ./services/analytics/internal/consumer/
func BenchmarkConsumerThroughput(b *testing.B) {
	var baseline float64
	b.Run("baseline-direct-insert", func(b *testing.B) { baseline = benchDirectInsert(b) })
	fake := startAllowAll(b)
	for _, n := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("consumers=%d", n), func(b *testing.B) { benchThroughput(b, fake, n, baseline) })
	}
	if addr := os.Getenv("KURZ_BENCH_LIMITER_ADDR"); addr != "" {
		for _, n := range []int{1, 2, 4} {
			b.Run(fmt.Sprintf("limiter=%s/consumers=%d", addr, n), func(b *testing.B) { benchThroughput(b, addr, n, baseline) })
		}
	}
}

// throughputEvents returns the benchmark's events for e's tenant.
func (e *env) throughputEvents() []clickevent.Event {
	events := make([]clickevent.Event, benchEvents)
	for j := range events {
		ua := chromeUA
		switch {
		case j%10 == 0:
			ua = botUA
		case j%3 == 0:
			ua = iphoneUA
		}
		events[j] = e.click(fmt.Sprintf("b%s%d", e.tenant[7:13], j%200), time.Duration(j)*50*time.Millisecond,
			visitor(j%10_000), ua, "https://t.co/x")
	}
	return events
}

// benchDirectInsert is the baseline: the consumer's rows (flags aside: no
// limiter or first-visit marks) inserted directly. It returns events/s.
func benchDirectInsert(b *testing.B) float64 {
	var total int
	var elapsed time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e := newEnv(b)
		c, err := New(e.rdb, e.store, nil, slog.New(slog.DiscardHandler), noop.NewMeterProvider(), e.opts())
		if err != nil {
			b.Fatal(err)
		}
		events := e.throughputEvents()
		// The entries as the readers hand them over (values as go-redis
		// returns them), turned into rows by the consumer's own prepare.
		es := make([]entry, len(events))
		now := time.Now()
		for j, ev := range events {
			vals := ev.Values()
			m := make(map[string]any, len(vals)/2)
			for k := 0; k < len(vals); k += 2 {
				m[vals[k]] = vals[k+1]
			}
			es[j] = entry{shard: j % testShards, id: strconv.Itoa(j), values: m, readAt: now}
		}
		w := c.prepare(es)
		if len(w.rows) != benchEvents || len(w.poison) != 0 {
			b.Fatalf("prepared %d rows, %d poisoned; want %d rows", len(w.rows), len(w.poison), benchEvents)
		}
		batches := make([][]clickstore.Click, 0, benchEvents/benchBatch)
		for start := 0; start < len(w.rows); start += benchBatch {
			rows := w.rows[start:min(start+benchBatch, len(w.rows))]
			clicks := make([]clickstore.Click, len(rows))
			for k, r := range rows {
				clicks[k] = r.click
			}
			batches = append(batches, clicks)
		}
		ctx := context.Background()
		b.StartTimer()
		began := time.Now()
		for _, clicks := range batches {
			if err := e.store.Insert(ctx, clicks); err != nil {
				b.Fatal(err)
			}
		}
		elapsed += time.Since(began)
		b.StopTimer()
		e.checkStored(benchEvents)
		total += benchEvents
	}
	rate := float64(total) / elapsed.Seconds()
	b.ReportMetric(rate, "events/s")
	return rate
}

// benchThroughput drains the events with n consumers of one group, each
// under its own name, and checks that nothing is left pending and that every
// event counts once. baseline (events/s, 0: unknown) gives the ratio.
func benchThroughput(b *testing.B, limiterAddr string, n int, baseline float64) {
	q := limiterClient(b, limiterAddr, 500*time.Millisecond) // KURZ_ANALYTICS_LIMITER_TIMEOUT's default
	var total int
	var degraded int64
	var elapsed time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e := newEnv(b)
		events := e.throughputEvents()
		// Pipelines of 1,000: one of 5,000 can outlast the client's read
		// timeout on a busy machine.
		for start := 0; start < len(events); start += 1000 {
			e.xadd(events[start:min(start+1000, len(events))]...)
		}
		opts := e.opts()
		// A batch fills by size while the backlog drains; the age only
		// flushes the last, partial one. The default 1 s would add up to a
		// second of idle waiting to a 1-2 s drain (measured: 24,000/s with
		// it, 43,000/s without); the lag from click to stats is measured on
		// its own (clicklag).
		opts.BatchSize, opts.BatchAge, opts.ReadBlock = benchBatch, 100*time.Millisecond, time.Second
		opts.ClaimIdle, opts.ClaimEvery = 30*time.Second, 5*time.Second
		b.StartTimer()
		began := time.Now()
		rs := make([]*running, n)
		for k := range rs {
			o := opts
			o.Name = fmt.Sprintf("%s-%d", opts.Name, k)
			rs[k] = e.start(o, e.rdb, e.store, q)
		}
		consumed := func() int64 {
			var sum int64
			for _, r := range rs {
				sum += metrictest.Counter(b, r.reader, MetricConsumed)
			}
			return sum
		}
		eventually(b, 5*time.Minute, "all events consumed", func() (bool, string) {
			got := consumed()
			return got >= benchEvents, fmt.Sprintf("consumed %d", got)
		})
		// Done when the group holds nothing more: at once, unless entries
		// were claimed and stored twice (flushes slower than ClaimIdle on
		// an overloaded machine), which makes the count run ahead.
		eventually(b, time.Minute, "nothing left in the group", func() (bool, string) {
			backlog := e.backlog()
			return backlog == 0, fmt.Sprintf("%d entries pending or unread", backlog)
		})
		elapsed += time.Since(began)
		b.StopTimer()
		for _, r := range rs {
			degraded += metrictest.Counter(b, r.reader, MetricDegraded)
			r.stop(b)
		}
		if p := e.pending(); p != 0 {
			b.Fatalf("pending %d after consuming everything", p)
		}
		if got := consumed(); got != benchEvents {
			b.Logf("consumed %d for %d events: claimed entries stored twice (suspect, counted once)", got, benchEvents)
		}
		e.checkStored(benchEvents)
		total += benchEvents
	}
	rate := float64(total) / elapsed.Seconds()
	b.ReportMetric(rate, "events/s")
	// Clicks stored unflagged because a flood check went unanswered within
	// its deadline: a faster drain that skipped its checks is not faster.
	b.ReportMetric(float64(degraded)/float64(total), "unchecked/event")
	if baseline > 0 {
		b.ReportMetric(rate/baseline, "x-baseline")
	}
}

// checkStored fails unless the raw table holds the want events of the env's
// tenant, each once or, if more often, with a suspect copy among them (the
// copies the statistics subtract; see clickstore), so that GetLinkStats
// counts every event once.
func (e *env) checkStored(want uint64) {
	e.t.Helper()
	var events, rows, uncorrected uint64
	if err := e.ch.QueryRow(context.Background(), `SELECT count(), sum(n), countIf(n > 1 AND s = 0)
		FROM (SELECT event_id, count() AS n, sum(suspect) AS s FROM `+clickstore.EventsTable+`
			WHERE tenant = ? GROUP BY event_id)`, e.tenant).Scan(&events, &rows, &uncorrected); err != nil {
		e.t.Fatalf("count rows: %v", err)
	}
	if events != want || uncorrected != 0 {
		e.t.Fatalf("stored %d events in %d rows, %d of them twice without a suspect copy; want %d events, none uncorrected",
			events, rows, uncorrected, want)
	}
}

// backlog is the number of entries the group has not acknowledged yet,
// delivered (pending) or not (unread), over every shard.
func (e *env) backlog() int64 {
	e.t.Helper()
	n, err := clickevent.TotalBacklog(context.Background(), e.rdb, e.streams(), e.group)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// allowAllLimiter allows every CheckQuota, like limitertest.AllowAll, but
// keeps no record of the calls: a run makes 45,000 of them, and limitertest's
// copies of every request would pile up in the heap the consumer's garbage
// collector works through, slowing each batch more than the last. The real
// limiter runs in another process.
type allowAllLimiter struct {
	ratelimitv1.UnimplementedRateLimitServiceServer
}

func (allowAllLimiter) CheckQuota(context.Context, *ratelimitv1.CheckQuotaRequest) (*ratelimitv1.CheckQuotaResponse, error) {
	return limitertest.AllowAll(nil), nil
}

// CheckQuotas is what the consumer calls. (Before it was here, the fake
// answered Unimplemented and every "allow-all" run measured consumers whose
// flood checks all failed, as unchecked/event now shows.)
func (allowAllLimiter) CheckQuotas(_ context.Context, req *ratelimitv1.CheckQuotasRequest) (*ratelimitv1.CheckQuotasResponse, error) {
	out := make([]*ratelimitv1.CheckQuotaResponse, len(req.GetChecks()))
	for i := range out {
		out[i] = limitertest.AllowAll(nil)
	}
	return &ratelimitv1.CheckQuotasResponse{Results: out}, nil
}

// startAllowAll serves an allowAllLimiter on a loopback port until the
// benchmark ends and returns its address.
func startAllowAll(b *testing.B) string {
	b.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer()
	ratelimitv1.RegisterRateLimitServiceServer(g, allowAllLimiter{})
	go func() { _ = g.Serve(lis) }()
	b.Cleanup(g.Stop)
	return lis.Addr().String()
}
