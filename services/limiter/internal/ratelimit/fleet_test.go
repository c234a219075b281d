package ratelimit

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"kurz.dev/pkg/testkit/metrictest"
)

// fakeFleet is a heartbeat that answers a count the test sets, or fails.
type fakeFleet struct {
	count int64
	err   error
	left  bool
}

func (f *fakeFleet) beat(_ context.Context, leave bool) (int64, error) {
	if f.err != nil {
		return 0, f.err
	}
	if leave {
		f.left = true
	}
	return f.count, nil
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// localRule holds 1,200 a day: over a test's few milliseconds nothing
// refills, so a burst shows the share exactly.
func localRule(t *testing.T) *Rule {
	t.Helper()
	rs := compile(t, `
domains:
  f:
    rules:
      - {name: local, key: [user], algorithm: token_bucket, limit: 1200, window: 24h, failure_mode: local}
`)
	_, applied := rs.Match("f", map[string]string{"user": "u"})
	return applied[0].Rule
}

// admitted is how many of 2,000 calls of cost 1 a fresh key admits.
func admitted(l *localLimiter, r *Rule, key string) int {
	now := time.Now()
	n := 0
	for range 2000 {
		if l.take(key, r, 1, now).allowed {
			n++
		}
	}
	return n
}

func TestLocalShareFollowsTheFleetUpAndDown(t *testing.T) {
	hb := &fakeFleet{}
	f := newFleet(hb.beat, time.Second, 12, quiet)
	l, err := newLocalLimiter(f, 100)
	if err != nil {
		t.Fatal(err)
	}
	r := localRule(t)
	ctx := context.Background()
	for i, step := range []struct {
		count int64
		want  int
	}{{1, 1200}, {3, 400}, {12, 100}, {4, 300}, {1, 1200}} {
		hb.count = step.count
		f.beatOnce(ctx)
		if got := f.Size(); got != int(step.count) {
			t.Errorf("step %d: fleet size %d after a heartbeat read %d", i, got, step.count)
		}
		if got := admitted(l, r, "k"+string(rune('a'+i))); got != step.want {
			t.Errorf("step %d, %d replicas: a fresh key admitted %d, want %d (1200/%d)", i, step.count, got, step.want, step.count)
		}
	}
}

func TestFleetSizeIsTheMaximumUntilACountIsRead(t *testing.T) {
	hb := &fakeFleet{err: errors.New("redis down")}
	f := newFleet(hb.beat, time.Second, 12, quiet)
	l, _ := newLocalLimiter(f, 100)
	r := localRule(t)
	f.beatOnce(context.Background())
	if f.Size() != 12 || f.Known() {
		t.Fatalf("Redis down from the start: size %d known %v, want the maximum 12, unknown", f.Size(), f.Known())
	}
	if got := admitted(l, r, "k"); got != 100 {
		t.Errorf("no count read: a fresh key admitted %d, want 100 (1200/12)", got)
	}
}

func TestFleetKeepsTheLastCountWhileRedisIsDown(t *testing.T) {
	hb := &fakeFleet{count: 3}
	f := newFleet(hb.beat, time.Second, 12, quiet)
	ctx := context.Background()
	f.beatOnce(ctx)
	hb.err = errors.New("redis down")
	for range 5 {
		f.beatOnce(ctx)
	}
	if f.Size() != 3 || !f.Known() {
		t.Fatalf("Redis down after a count of 3: size %d known %v, want 3, known", f.Size(), f.Known())
	}
	hb.err, hb.count = nil, 2
	f.beatOnce(ctx)
	if f.Size() != 2 {
		t.Errorf("Redis back with a count of 2: size %d", f.Size())
	}
}

// A share that shrinks applies to buckets already full, at once.
func TestAGrownFleetShrinksFullBucketsAtOnce(t *testing.T) {
	hb := &fakeFleet{count: 1}
	f := newFleet(hb.beat, time.Second, 12, quiet)
	ctx := context.Background()
	f.beatOnce(ctx)
	l, _ := newLocalLimiter(f, 100)
	r := localRule(t)
	now := time.Now()
	if !l.take("k", r, 1, now).allowed { // the bucket now holds 1199
		t.Fatal("first take denied")
	}
	hb.count = 6
	f.beatOnce(ctx)
	n := 0
	for range 2000 {
		if l.take("k", r, 1, now).allowed {
			n++
		}
	}
	if n != 200 {
		t.Errorf("after growing to 6 replicas, a full bucket admitted %d more, want 200 (1200/6)", n)
	}
}

func TestFleetRunLeavesOnShutdown(t *testing.T) {
	hb := &fakeFleet{count: 2}
	f := newFleet(hb.beat, time.Hour, 12, quiet)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f.Run(ctx) // one beat, then the context is done: leave
	if f.Size() != 2 || !hb.left {
		t.Errorf("size %d, left %v: want the count read (2) and a leave", f.Size(), hb.left)
	}
}

func TestStaticFleetIsTheReplicasSetting(t *testing.T) {
	for _, n := range []int{0, 1, 3} {
		f := StaticFleet(n)
		want := max(n, 1)
		if f.Size() != want || !f.Known() {
			t.Errorf("StaticFleet(%d): size %d known %v, want %d known", n, f.Size(), f.Known(), want)
		}
		f.Run(context.Background()) // returns at once: nothing to heartbeat
	}
}

func TestFleetGaugeReportsTheSizeInUse(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	f, err := NewFleet(nil, FleetOptions{Name: "g", ID: "r1", Heartbeat: time.Second, MaxReplicas: 12}, quiet, mp)
	if err != nil {
		t.Fatal(err)
	}
	const name = "kurz.ratelimit.fleet.replicas"
	if got := metrictest.Gauge(t, reader, name); got != 12 || !metrictest.Series(t, reader, name, "known", "false") {
		t.Errorf("before a count: gauge %d, want 12 with known=false", got)
	}
	hb := &fakeFleet{count: 5}
	f.beat = hb.beat
	f.beatOnce(context.Background())
	if got := metrictest.Gauge(t, reader, name); got != 5 || !metrictest.Series(t, reader, name, "known", "true") {
		t.Errorf("after a count of 5: gauge %d, want 5 with known=true", got)
	}
}

func TestFleetOptionsAreChecked(t *testing.T) {
	for name, o := range map[string]FleetOptions{
		"empty name":      {Name: "", Heartbeat: time.Second, MaxReplicas: 1},
		"brace in name":   {Name: "a}b", Heartbeat: time.Second, MaxReplicas: 1},
		"long name":       {Name: string(make([]byte, 65)), Heartbeat: time.Second, MaxReplicas: 1},
		"no heartbeat":    {Name: "a", MaxReplicas: 1},
		"no max replicas": {Name: "a", Heartbeat: time.Second},
	} {
		if _, err := NewFleet(nil, o, quiet, nil); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
