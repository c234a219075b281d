package metrictest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

func TestCounterSumsThePointsWithTheAttribute(t *testing.T) {
	r, m := New()
	c, err := m.Int64Counter("calls")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c.Add(ctx, 2, metric.WithAttributes(attribute.String("code", "ok")))
	c.Add(ctx, 3, metric.WithAttributes(attribute.String("code", "error")))
	c.Add(ctx, 0, metric.WithAttributes(attribute.String("code", "unknown")))
	for _, tc := range []struct {
		attr   []string
		sum    int64
		series bool
	}{
		{nil, 5, true},
		{[]string{"code", "ok"}, 2, true},
		{[]string{"code", "unknown"}, 0, true},
		{[]string{"code", "absent"}, 0, false},
	} {
		if got := Counter(t, r, "calls", tc.attr...); got != tc.sum {
			t.Errorf("Counter(calls, %v) = %d, want %d", tc.attr, got, tc.sum)
		}
		if got := Series(t, r, "calls", tc.attr...); got != tc.series {
			t.Errorf("Series(calls, %v) = %v, want %v", tc.attr, got, tc.series)
		}
	}
	if Series(t, r, "other") {
		t.Error("Series of a counter never made = true")
	}
}

func TestGaugeReadsThePointWithTheAttribute(t *testing.T) {
	r, m := New()
	_, err := m.Int64ObservableGauge("depth", metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
		o.Observe(7, metric.WithAttributes(attribute.String("stream", "a")))
		o.Observe(0, metric.WithAttributes(attribute.String("stream", "b")))
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got := Gauge(t, r, "depth", "stream", "a"); got != 7 {
		t.Errorf("Gauge(depth, stream=a) = %d, want 7", got)
	}
	if got := Gauge(t, r, "depth", "stream", "b"); got != 0 {
		t.Errorf("Gauge(depth, stream=b) = %d, want 0", got)
	}
}
