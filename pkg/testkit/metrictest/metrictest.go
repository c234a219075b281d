// Package metrictest reads the OpenTelemetry counters a component under
// test records, through a ManualReader: no exporter, no /metrics scrape.
package metrictest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// New returns a meter whose measurements r collects.
func New() (r *sdkmetric.ManualReader, m metric.Meter) {
	r = sdkmetric.NewManualReader()
	return r, sdkmetric.NewMeterProvider(sdkmetric.WithReader(r)).Meter("metrictest")
}

// Counter sums the data points of the int64 counter name, only those with
// attribute attr[0] = attr[1] if attr is given. An attribute of any type
// matches by its text: "true", "42", "a".
func Counter(t testing.TB, r *sdkmetric.ManualReader, name string, attr ...string) int64 {
	t.Helper()
	var n int64
	for _, dp := range points(t, r, name, attr) {
		n += dp.Value
	}
	return n
}

// Gauge is the value of the int64 gauge name with attribute attr[0] =
// attr[1] (or its only point); the test fails if there is none or more
// than one.
func Gauge(t testing.TB, r *sdkmetric.ManualReader, name string, attr ...string) int64 {
	t.Helper()
	dps := points(t, r, name, attr)
	if len(dps) != 1 {
		t.Fatalf("%s %v: %d points, want one", name, attr, len(dps))
	}
	return dps[0].Value
}

// Series reports whether the int64 counter or gauge name has a data point
// (of any value, 0 included) with attribute attr[0] = attr[1], or any if
// attr is not given: whether a dashboard would see the series at all.
func Series(t testing.TB, r *sdkmetric.ManualReader, name string, attr ...string) bool {
	t.Helper()
	return len(points(t, r, name, attr)) > 0
}

func points(t testing.TB, r *sdkmetric.ManualReader, name string, attr []string) []metricdata.DataPoint[int64] {
	t.Helper()
	if len(attr) != 0 && len(attr) != 2 {
		t.Fatalf("metrictest: attr is a key and a value, got %q", attr)
	}
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var out []metricdata.DataPoint[int64]
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			var dps []metricdata.DataPoint[int64]
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				dps = d.DataPoints
			case metricdata.Gauge[int64]:
				dps = d.DataPoints
			default:
				t.Fatalf("%s is %T, want an int64 sum or gauge", name, m.Data)
			}
			for _, dp := range dps {
				if len(attr) == 2 {
					if v, ok := dp.Attributes.Value(attribute.Key(attr[0])); !ok || v.Emit() != attr[1] {
						continue
					}
				}
				out = append(out, dp)
			}
		}
	}
	return out
}
