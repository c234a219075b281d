package consumer

import (
	"fmt"
	"os"
	"testing"
	"time"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/fakelimiter"
)

// BenchmarkConsumerThroughput measures events per second from the streams
// into ClickHouse, acknowledged: 50,000 events (200 links, 10,000 visitors,
// one bot in ten) are appended beforehand in the producer's format, then one
// consumer with the production batch settings (5,000 events or 1 s) drains
// them. The limiter is an in-process fake, or the limiter at
// KURZ_BENCH_LIMITER_ADDR when that is set (e.g. 127.0.0.1:9091 after make up).
//
//	KURZ_CLICKHOUSE_DATABASE=kurz_test go test -run '^$' -bench ConsumerThroughput -benchtime 3x ./services/analytics/internal/consumer/
func BenchmarkConsumerThroughput(b *testing.B) {
	limiters := map[string]string{"fake-limiter": fakelimiter.Start(b, fakelimiter.AllowAll).Addr()}
	if addr := os.Getenv("KURZ_BENCH_LIMITER_ADDR"); addr != "" {
		limiters["limiter-"+addr] = addr
	}
	for name, addr := range limiters {
		b.Run(name, func(b *testing.B) { benchThroughput(b, addr) })
	}
}

func benchThroughput(b *testing.B, limiterAddr string) {
	const n = 50_000
	q := limiterClient(b, limiterAddr, 50*time.Millisecond)
	var total int
	var elapsed time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e := newEnv(b)
		events := make([]clickevent.Event, n)
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
		for start := 0; start < n; start += 5000 {
			e.xadd(events[start : start+5000]...)
		}
		opts := e.opts()
		opts.BatchSize, opts.BatchAge, opts.ReadBlock = 5000, time.Second, time.Second
		opts.ClaimIdle, opts.ClaimEvery = 30*time.Second, 5*time.Second
		b.StartTimer()
		began := time.Now()
		r := e.start(opts, e.rdb, e.store, q)
		eventually(b, 5*time.Minute, "all events consumed", func() (bool, string) {
			got := counter(b, r.reader, MetricConsumed)
			return got >= n, fmt.Sprintf("consumed %d", got)
		})
		elapsed += time.Since(began)
		b.StopTimer()
		if p := e.pending(); p != 0 {
			b.Fatalf("pending %d after consuming everything", p)
		}
		r.stop(b)
		total += n
	}
	b.ReportMetric(float64(total)/elapsed.Seconds(), "events/s")
}
