package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metric names (Prometheus: dots become underscores, counters get _total).
const (
	MetricConsumed     = "kurz.analytics.events.consumed"
	MetricSkipped      = "kurz.analytics.events.duplicates_skipped"
	MetricDeadLettered = "kurz.analytics.events.dead_lettered"
	MetricClaimed      = "kurz.analytics.events.claimed"
	MetricUnreplicated = "kurz.analytics.events.read_unreplicated"
	MetricTrimmed      = "kurz.analytics.events.trimmed"
	MetricFloods       = "kurz.analytics.events.flood_flagged"
	MetricDegraded     = "kurz.analytics.flood_checks.degraded"
	MetricFailures     = "kurz.analytics.flush.failures"
	MetricBatchSize    = "kurz.analytics.batch.size"
	MetricFlushTime    = "kurz.analytics.flush.duration"
	MetricLag          = "kurz.analytics.consumer.lag"
	MetricOverrun      = "kurz.analytics.consumer.overrun"
)

// deadLetterReasons and flushStages are the values of the reason and
// stage attributes (poisoned.kind, store1's stages).
var (
	deadLetterReasons = []string{"unparseable", "deliveries", "trimmed"}
	flushStages       = []string{"dead_letter", "lookup", "visitors", "insert"}
)

type metrics struct {
	consumed, skippedC, dead, claimedC, unreplicatedC, trimmedC, floodsC, degradedC, failures metric.Int64Counter
	batchSize                                                                                 metric.Int64Histogram
	flushTime                                                                                 metric.Float64Histogram
	// streams are the stream attribute of each shard's reads, built once.
	streams []metric.AddOption
}

func newMetrics(mp metric.MeterProvider, c *Consumer) (*metrics, error) {
	meter := mp.Meter("kurz.dev/services/analytics/consumer")
	m := &metrics{}
	var errs []error
	counter := func(name, desc, unit string) metric.Int64Counter {
		ctr, err := meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return ctr
	}
	m.consumed = counter(MetricConsumed, "Click events stored in ClickHouse", "{event}")
	m.skippedC = counter(MetricSkipped, "Click events not stored again: reason=in_batch (twice in one batch), stored (ClickHouse had them) or kept_by_failed_insert (ClickHouse kept them from an insert it refused: possibly missing from the aggregates)", "{event}")
	m.dead = counter(MetricDeadLettered, "Click entries moved to a dead-letter stream: reason=unparseable, deliveries or trimmed", "{entry}")
	m.claimedC = counter(MetricClaimed, "Pending click entries claimed from idle consumers", "{entry}")
	m.unreplicatedC = counter(MetricUnreplicated, "Click entries read first-hand by a read fewer than KURZ_ANALYTICS_READ_REPLICAS replicas acknowledged in time, by stream: stored as suspect, so a failover that delivers them again cannot count them twice", "{entry}")
	for _, k := range c.keys {
		m.streams = append(m.streams, metric.WithAttributeSet(attribute.NewSet(attribute.String("stream", k))))
	}
	m.trimmedC = counter(MetricTrimmed, "Pending click entries lost: trimmed from the stream (MAXLEN) before they were stored", "{entry}")
	m.floodsC = counter(MetricFloods, "Click events flagged as a flood: over the limiter's clicks rule, or over its last reported limit in one check the limiter did not answer", "{event}")
	m.degradedC = counter(MetricDegraded, "Click events stored unflagged because the limiter did not answer, or answered by the rule's failure mode", "{event}")
	m.failures = counter(MetricFailures, "Failed flush attempts by stage (dead_letter, lookup, visitors, insert)", "{attempt}")
	// The series the alerts read exist from the start, at 0: Prometheus's
	// increase() does not count a series' first sample, so a loss that
	// appeared as a new series at N (one trim, one poison entry) would
	// never fire KurzClicksLost or KurzClickDeadLetters.
	if errors.Join(errs...) == nil {
		m.trimmedC.Add(bg, 0)
		for _, reason := range deadLetterReasons {
			m.dead.Add(bg, 0, metric.WithAttributes(attribute.String("reason", reason)))
		}
		for _, stage := range flushStages {
			m.failures.Add(bg, 0, metric.WithAttributes(attribute.String("stage", stage)))
		}
	}
	var err error
	m.batchSize, err = meter.Int64Histogram(MetricBatchSize, metric.WithDescription("Entries per flushed batch"),
		metric.WithUnit("{entry}"), metric.WithExplicitBucketBoundaries(1, 10, 100, 500, 1000, 2500, 5000, 10000, 25000))
	errs = append(errs, err)
	m.flushTime, err = meter.Float64Histogram(MetricFlushTime, metric.WithDescription("Time from a batch's flush to its acknowledgement, retries included"),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
	errs = append(errs, err)
	lag, err := meter.Int64ObservableGauge(MetricLag,
		metric.WithDescription("Click entries not yet stored per stream: pending (delivered, unacknowledged) + unread"),
		metric.WithUnit("{entry}"))
	errs = append(errs, err)
	overrun, err := meter.Int64ObservableGauge(MetricOverrun,
		metric.WithDescription("1 while a trim has passed the group's last delivered entry of the stream: entries nobody read were trimmed, their clicks lost"))
	errs = append(errs, err)
	// Both gauges from one reading of the last refresh, per stream.
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, l := range c.lag {
			stream := metric.WithAttributes(attribute.String("stream", l.Stream))
			o.ObserveInt64(lag, l.Pending+l.Unread, stream)
			var v int64
			if l.Overrun {
				v = 1
			}
			o.ObserveInt64(overrun, v, stream)
		}
		return nil
	}, lag, overrun)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("consumer metrics: %w", err)
	}
	return m, nil
}

var bg = context.Background()

func (m *metrics) flushed(entries, rows int, d time.Duration) {
	m.consumed.Add(bg, int64(rows))
	m.batchSize.Record(bg, int64(entries))
	m.flushTime.Record(bg, d.Seconds())
}

func (m *metrics) skipped(reason string, n int) {
	m.skippedC.Add(bg, int64(n), metric.WithAttributes(attribute.String("reason", reason)))
}

func (m *metrics) deadLettered(reason string) {
	m.dead.Add(bg, 1, metric.WithAttributes(attribute.String("reason", reason)))
}

func (m *metrics) claimed(n int)  { m.claimedC.Add(bg, int64(n)) }
func (m *metrics) trimmed(n int)  { m.trimmedC.Add(bg, int64(n)) }
func (m *metrics) floods(n int)   { m.floodsC.Add(bg, int64(n)) }
func (m *metrics) degraded(n int) { m.degradedC.Add(bg, int64(n)) }

func (m *metrics) unreplicated(shard, n int) { m.unreplicatedC.Add(bg, int64(n), m.streams[shard]) }

func (m *metrics) failure(stage string) {
	m.failures.Add(bg, 1, metric.WithAttributes(attribute.String("stage", stage)))
}
