package telemetry

import (
	"maps"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// AttrSets holds the attribute sets a hot path records with, one per key of
// the caller's (a comparable struct of what the attributes are made of),
// each built once, as the option slices Add and Record take. A lookup reads
// an immutable map, and passing its slice with ... allocates nothing: a
// sync.Map lookup and a fresh one-option slice per measurement were two
// allocations per measurement. Past its limit, keys share one overflow set,
// so the cache and the metric's series stay bounded whatever the keys.
type AttrSets[K comparable] struct {
	max      int
	overflow Opts

	mu sync.Mutex // serialises building
	m  atomic.Pointer[map[K]Opts]
}

// Opts are one attribute set's options, for Add(ctx, n, o.Add...) and
// Record(ctx, v, o.Record...).
type Opts struct {
	Add    []metric.AddOption
	Record []metric.RecordOption
}

// OptsOf is the options of the set of kv.
func OptsOf(kv ...attribute.KeyValue) Opts {
	o := metric.WithAttributeSet(attribute.NewSet(kv...))
	return Opts{Add: []metric.AddOption{o}, Record: []metric.RecordOption{o}}
}

// SeriesLimit is the OpenTelemetry SDK's default cardinality limit: past
// it the SDK folds an instrument's new series into one overflow series, so
// caching more sets than that would only cost memory.
const SeriesLimit = 2000

// Overflow is the attribute of the series the keys past an AttrSets' limit
// share, the one the SDK gives its own overflow series.
var Overflow = attribute.Bool("otel.metric.overflow", true)

// NewAttrSets returns a cache of at most max sets; the keys after those
// record with overflow.
func NewAttrSets[K comparable](max int, overflow ...attribute.KeyValue) *AttrSets[K] {
	s := &AttrSets[K]{max: max, overflow: OptsOf(overflow...)}
	s.m.Store(&map[K]Opts{})
	return s
}

// Get returns k's set, built by build on first use.
func (s *AttrSets[K]) Get(k K, build func() []attribute.KeyValue) Opts {
	m := *s.m.Load()
	if v, ok := m[k]; ok {
		return v
	}
	if len(m) >= s.max {
		return s.overflow // full for good: no lock
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.m.Load()
	if v, ok := old[k]; ok {
		return v
	}
	if len(old) >= s.max {
		return s.overflow
	}
	// Copied on write: keys are few and built once each.
	next := make(map[K]Opts, len(old)+1)
	maps.Copy(next, old)
	v := OptsOf(build()...)
	next[k] = v
	s.m.Store(&next)
	return v
}
