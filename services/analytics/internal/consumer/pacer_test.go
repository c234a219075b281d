package consumer

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/quota"
	"kurz.dev/services/analytics/internal/clickstore"
)

func TestPacerStartsAtOneAndGrowsByAWindowPerWindow(t *testing.T) {
	p := newPacer(4)
	if got := p.size(); got != 1 {
		t.Fatalf("initial window %v, want 1", got)
	}
	// A window of 1: one decided call grows it to 2; two more to 3.
	for _, want := range []float64{2, 2.5, 2.9, 3.2} {
		if err := p.acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
		p.release(true)
		if got := p.size(); got < want-0.05 || got > want+0.05 {
			t.Fatalf("window %v, want about %v", got, want)
		}
	}
	for range 100 {
		_ = p.acquire(context.Background())
		p.release(true)
	}
	if got := p.size(); got != 4 {
		t.Errorf("window %v after 100 decided calls, want the cap 4", got)
	}
}

func TestPacerHalvesOnAnUncheckedCallDownToOne(t *testing.T) {
	p := newPacer(16)
	p.window = 16
	for _, want := range []float64{8, 4, 2, 1, 1} {
		_ = p.acquire(context.Background())
		p.release(false)
		if got := p.size(); got != want {
			t.Fatalf("window %v, want %v", got, want)
		}
	}
}

func TestPacerHoldsCallsBeyondTheWindowUntilOneEnds(t *testing.T) {
	p := newPacer(8) // window 1
	if err := p.acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- p.acquire(context.Background()) }()
	select {
	case err := <-got:
		t.Fatalf("a second call started in a window of 1 (%v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	p.release(true)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting call did not start after a release")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p.window = 1 // the two in flight fill any window below 2
	if err := p.acquire(ctx); err == nil {
		t.Error("acquire with a cancelled context and a full window succeeded")
	}
}

// scriptedQuota answers every CheckMany call with answer, counting calls.
type scriptedQuota struct {
	mu     sync.Mutex
	calls  int
	answer quota.Decision
}

func (q *scriptedQuota) CheckMany(_ context.Context, reqs []quota.Request, _ quota.Policy) []quota.Decision {
	q.mu.Lock()
	q.calls++
	q.mu.Unlock()
	out := make([]quota.Decision, len(reqs))
	for i := range out {
		out[i] = q.answer
	}
	return out
}

func floodGroups(n int) []*floodGroup {
	gs := make([]*floodGroup, n)
	for i := range gs {
		gs[i] = &floodGroup{cost: 1, rows: []*row{{click: clickstore.Click{Code: "c", Visitor: strconv.Itoa(i)}}}}
	}
	return gs
}

// A call the limiter did not answer at all stops the batch's other calls:
// a hung limiter costs a batch one deadline, not one per call.
func TestAskFloodsStopsAfterACallWithNoAnswer(t *testing.T) {
	q := &scriptedQuota{answer: quota.Decision{Allowed: true, Degraded: true}}
	c := &Consumer{quota: q, pace: newPacer(16), opts: Options{FloodParallelism: 16}} // window 1
	gs := floodGroups(10 * FloodChecksPerCall)
	c.askFloods(context.Background(), gs)
	if q.calls != 1 {
		t.Errorf("%d CheckQuotas calls for 10 chunks, want 1: the first went unanswered", q.calls)
	}
	for i, g := range gs {
		if !g.degraded || !g.done {
			t.Fatalf("group %d: degraded %v, done %v; want every group degraded", i, g.degraded, g.done)
		}
	}
}

// Answers by the rule's failure mode checked nothing: the groups are
// degraded and the pacer backs off to one call in flight.
func TestAskFloodsBacksOffOnFailureModeAnswers(t *testing.T) {
	q := &scriptedQuota{answer: quota.Decision{Allowed: true, Source: ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_OPEN}}
	c := &Consumer{quota: q, pace: newPacer(16), opts: Options{FloodParallelism: 16}}
	c.pace.window = 16
	gs := floodGroups(10 * FloodChecksPerCall)
	c.askFloods(context.Background(), gs)
	if q.calls != 10 {
		t.Errorf("%d calls, want 10 (the limiter answered each)", q.calls)
	}
	if got := c.pace.size(); got != 1 {
		t.Errorf("window %v after 10 failure-mode answers, want 1", got)
	}
	for i, g := range gs {
		if !g.degraded || g.allowed != 1 {
			t.Fatalf("group %d: degraded %v, allowed %d; want degraded and unflagged", i, g.degraded, g.allowed)
		}
	}
}

// A check the limiter did not answer (or answered by the rule's failure
// mode) leaves at most the flood rule's limit, as the limiter last reported
// it, of one visitor's clicks unflagged: one unanswered check must not count
// a flooder's batch as human. Before any report there is no bound.
func TestUncheckedGroupsKeepAtMostTheLimit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answer   quota.Decision
		known    int64
		wantLeft int // of the 25 clicks, unflagged
	}{
		{"no answer, limit never reported", quota.Decision{Allowed: true, Degraded: true}, 0, 25},
		{"no answer, limit 10 reported before", quota.Decision{Allowed: true, Degraded: true}, 10, 10},
		{"no answer, limit above the group", quota.Decision{Allowed: true, Degraded: true}, 30, 25},
		{"failure mode reporting limit 7", quota.Decision{Allowed: true, Limit: 7, Source: ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_OPEN}, 0, 7},
		{"fail closed reporting limit 7", quota.Decision{Limit: 7, Source: ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED}, 0, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := &scriptedQuota{answer: tc.answer}
			c := &Consumer{quota: q, pace: newPacer(16), opts: Options{FloodParallelism: 16}}
			m, err := newMetrics(noop.NewMeterProvider(), c)
			if err != nil {
				t.Fatal(err)
			}
			c.m = m
			c.floodLimit.Store(tc.known)
			base := time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC)
			var rows []*row
			for i := range 25 {
				rows = append(rows, &row{e: &entry{id: strconv.Itoa(i)}, click: clickstore.Click{Code: "c", Visitor: "v", Time: base.Add(time.Duration(24-i) * time.Second)}})
			}
			c.judgeFloods(context.Background(), rows)
			var left []time.Time
			for _, r := range rows {
				if !r.click.Flood {
					left = append(left, r.click.Time)
				}
			}
			if len(left) != tc.wantLeft {
				t.Fatalf("%d of 25 clicks unflagged, want %d", len(left), tc.wantLeft)
			}
			for _, at := range left {
				if at.Sub(base) >= time.Duration(tc.wantLeft)*time.Second {
					t.Errorf("click at +%v unflagged: want the earliest %d", at.Sub(base), tc.wantLeft)
				}
			}
		})
	}
}
