package telemetry

import (
	"fmt"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

type testKey struct {
	name string
	n    int
}

// setOf is the attribute set a measurement option carries, encoded.
func setOf(o Opts) string {
	set := metric.NewAddConfig(o.Add).Attributes()
	if rec := metric.NewRecordConfig(o.Record).Attributes(); !rec.Equals(&set) {
		panic("Add and Record options of one set differ")
	}
	return set.Encoded(attribute.DefaultEncoder())
}

// Each key's set is built once, by its own build; a hit allocates nothing;
// keys past the limit share the overflow set and are not kept.
func TestAttrSetsBuildOnceAndBound(t *testing.T) {
	s := NewAttrSets[testKey](2, Overflow)
	builds := 0
	get := func(k testKey) Opts {
		return s.Get(k, func() []attribute.KeyValue {
			builds++
			return []attribute.KeyValue{attribute.String("name", k.name), attribute.Int("n", k.n)}
		})
	}
	a := get(testKey{"a", 1})
	if set := setOf(a); set != "n=1,name=a" {
		t.Fatalf("set of a: %q", set)
	}
	get(testKey{"a", 1})
	get(testKey{"a", 2})
	if builds != 2 {
		t.Fatalf("%d builds for two keys, want 2", builds)
	}
	if allocs := testing.AllocsPerRun(100, func() { get(testKey{"a", 1}) }); allocs != 0 {
		t.Errorf("a hit allocates %v times, want 0", allocs)
	}
	over := get(testKey{"b", 3})
	if got := setOf(over); got != "otel.metric.overflow=true" {
		t.Errorf("a key past the limit: set %q, want the overflow set", got)
	}
	if builds != 2 || len(*s.m.Load()) != 2 {
		t.Errorf("past the limit: %d builds, %d kept, want 2 and 2", builds, len(*s.m.Load()))
	}
}

// Concurrent first uses of one key agree on one set (run with -race).
func TestAttrSetsConcurrentFirstUse(t *testing.T) {
	s := NewAttrSets[int](SeriesLimit, Overflow)
	var wg sync.WaitGroup
	got := make([]string, 8)
	for i := range got {
		wg.Go(func() {
			got[i] = setOf(s.Get(i%2, func() []attribute.KeyValue { return []attribute.KeyValue{attribute.Int("k", i%2)} }))
		})
	}
	wg.Wait()
	for i, set := range got {
		if want := fmt.Sprintf("k=%d", i%2); set != want {
			t.Errorf("goroutine %d: set %q, want %q", i, set, want)
		}
	}
	if n := len(*s.m.Load()); n != 2 {
		t.Errorf("%d sets kept, want 2", n)
	}
}
