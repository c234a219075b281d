package consumer

import (
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"kurz.dev/pkg/testkit/metrictest"
)

// TestLossSeriesExistFromTheStart: the counters the click-loss alerts read
// are exported at 0 before anything is lost, so the first loss is an
// increase Prometheus sees.
func TestLossSeriesExistFromTheStart(t *testing.T) {
	r := sdkmetric.NewManualReader()
	if _, err := newMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(r)), &Consumer{}); err != nil {
		t.Fatal(err)
	}
	if !metrictest.Series(t, r, MetricTrimmed) {
		t.Errorf("%s: no series before the first trim", MetricTrimmed)
	}
	for _, reason := range deadLetterReasons {
		if !metrictest.Series(t, r, MetricDeadLettered, "reason", reason) {
			t.Errorf("%s{reason=%q}: no series before the first dead letter", MetricDeadLettered, reason)
		}
	}
	for _, stage := range flushStages {
		if !metrictest.Series(t, r, MetricFailures, "stage", stage) {
			t.Errorf("%s{stage=%q}: no series before the first failure", MetricFailures, stage)
		}
	}
	if n := metrictest.Counter(t, r, MetricDeadLettered) + metrictest.Counter(t, r, MetricFailures) + metrictest.Counter(t, r, MetricTrimmed); n != 0 {
		t.Errorf("the loss counters start at %d, want 0", n)
	}
}
