//go:build integration

package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/metrictest"
	"kurz.dev/services/analytics/internal/clickstore"
)

const (
	chromeUA = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36"
	iphoneUA = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1"
	botUA    = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
)

// want is what GetLinkStats must say about a set of events.
type want struct {
	total, human, bot, flood, visitors int64
	perDay                             map[time.Time]int64
	referrers, countries               map[string]int64
}

// expect computes want for events that the limiter does not flag; the
// breakdowns (referrers, countries) count human clicks only.
func expect(events []clickevent.Event) want {
	w := want{perDay: map[time.Time]int64{}, referrers: map[string]int64{}, countries: map[string]int64{}}
	seen := map[string]bool{}
	for _, ev := range events {
		w.total++
		day := ev.Time.UTC().Truncate(24 * time.Hour)
		w.perDay[day]++
		if strings.Contains(ev.UserAgent, "bot") {
			// Counted as a bot, in none of the breakdowns.
			w.bot++
			continue
		}
		w.human++
		if k := day.String() + ev.Visitor; !seen[k] {
			seen[k] = true
			w.visitors++
		}
		w.countries[ev.Country]++
		switch {
		case strings.Contains(ev.Referrer, "ycombinator"):
			w.referrers["news.ycombinator.com"]++
		case strings.Contains(ev.Referrer, "twitter"):
			w.referrers["twitter.com"]++
		case strings.Contains(ev.Referrer, "t.co"):
			w.referrers["t.co"]++
		default:
			w.referrers[""]++
		}
	}
	return w
}

// check compares a response with w, field by field.
func (w want) check(t *testing.T, resp *analyticsv1.GetLinkStatsResponse) {
	t.Helper()
	c := resp.GetCounts()
	got := [5]int64{c.GetTotal(), c.GetHuman(), c.GetBot(), c.GetFlood(), c.GetUniqueVisitors()}
	if exp := [5]int64{w.total, w.human, w.bot, w.flood, w.visitors}; got != exp {
		t.Errorf("counts (total, human, bot, flood, unique visitors) = %v, want %v", got, exp)
	}
	var series int64
	for _, b := range resp.GetSeries() {
		series += b.GetCounts().GetTotal()
		if g, e := b.GetCounts().GetTotal(), w.perDay[b.GetStartTime().AsTime()]; g != e {
			t.Errorf("bucket %s: %d clicks, want %d", b.GetStartTime().AsTime().Format(time.DateOnly), g, e)
		}
	}
	if series != w.total {
		t.Errorf("series adds up to %d, want %d", series, w.total)
	}
	for _, kc := range resp.GetTopReferrers() {
		if e := w.referrers[kc.GetKey()]; kc.GetCount() != e {
			t.Errorf("referrer %q: %d, want %d", kc.GetKey(), kc.GetCount(), e)
		}
	}
	if len(resp.GetTopReferrers()) != len(w.referrers) {
		t.Errorf("top referrers %v, want %d keys (%v)", resp.GetTopReferrers(), len(w.referrers), w.referrers)
	}
	for _, kc := range resp.GetTopCountries() {
		if e := w.countries[kc.GetKey()]; kc.GetCount() != e {
			t.Errorf("country %q: %d, want %d", kc.GetKey(), kc.GetCount(), e)
		}
	}
	if len(resp.GetTopCountries()) != len(w.countries) {
		t.Errorf("top countries %v, want %d keys (%v)", resp.GetTopCountries(), len(w.countries), w.countries)
	}
}

// mixed returns n events on code over two days: 37 visitors, four
// referrers (t.co first), a bot every 20th click, three countries and
// clicks of unknown country.
func (e *env) mixed(code string, n int) []clickevent.Event {
	refs := []string{"https://news.ycombinator.com/item?id=1", "https://www.twitter.com/x", "https://t.co/abc", ""}
	var out []clickevent.Event
	for i := range n {
		ua := chromeUA
		if i%20 == 0 {
			ua = botUA
		} else if i%3 == 0 {
			ua = iphoneUA
		}
		at := time.Duration(i%2)*24*time.Hour + time.Duration(i)*time.Second
		ev := e.click(code, at, visitor(i%37), ua, refs[[]int{0, 0, 2, 2, 2, 1, 3}[i%7]])
		ev.Country = []string{"DE", "JP", "", "FR", "DE"}[i%5]
		out = append(out, ev)
	}
	return out
}

func TestEventsArriveExactlyOnceWithStats(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := "all" + rnd()
	events := e.mixed(code, 400)
	r := e.start(e.opts(), e.rdb, e.store, allowAll(t))
	e.xadd(events...)

	w := expect(events)
	eventually(t, 20*time.Second, "all events stored and acknowledged", func() (bool, string) {
		p, n := e.pending(), e.stats(code).GetCounts().GetTotal()
		return p == 0 && n == w.total, fmt.Sprintf("pending %d, total %d", p, n)
	})
	resp := e.stats(code)
	w.check(t, resp)
	if got := len(resp.GetSeries()); got != 4 {
		t.Errorf("%d daily buckets, want 4 (the range spans four UTC days)", got)
	}
	if got, want := resp.GetTopReferrers()[0].GetKey(), "t.co"; got != want {
		t.Errorf("top referrer %q, want %q", got, want)
	}
	if got := e.rows(code); got != uint64(w.total) {
		t.Errorf("raw rows %d, want %d", got, w.total)
	}
	// A batch is counted after its acknowledgement: stopping the consumer
	// waits for the last batch's count, which nothing pending can show.
	r.stop(t)
	if got := metrictest.Counter(t, r.reader, MetricConsumed); got != w.total {
		t.Errorf("%s = %d, want %d", MetricConsumed, got, w.total)
	}
}

// TestCrashAfterInsertBeforeAck kills a consumer at the worst moment: its
// batch is in ClickHouse and nothing is acknowledged. A fresh consumer
// claims everything; the counts stay exact and the pending list drains.
func TestCrashAfterInsertBeforeAck(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := "crash" + rnd()
	events := e.mixed(code, 200)
	e.xadd(events...)
	q := allowAll(t)

	e.crashAfterInsert(q, func() {
		eventually(t, 10*time.Second, "every entry delivered to A", func() (bool, string) {
			p := e.pending()
			return p == int64(len(events)), fmt.Sprintf("pending %d", p)
		})
	})
	stored := e.rows(code)
	if p := e.pending(); p != int64(len(events)) || stored == 0 {
		t.Fatalf("after the crash: pending %d, raw rows %d; want %d pending (nothing acknowledged) and some rows", p, stored, len(events))
	}

	b := e.start(e.opts(), e.rdb, e.store, q)
	w := expect(events)
	eventually(t, 20*time.Second, "B drains what A left", func() (bool, string) {
		p, n := e.pending(), e.stats(code).GetCounts().GetTotal()
		return p == 0 && n == w.total, fmt.Sprintf("pending %d, total %d", p, n)
	})
	w.check(t, e.stats(code))
	if got := e.rows(code); got != uint64(w.total) {
		t.Errorf("raw rows %d, want %d: B must skip what A stored", got, w.total)
	}
	if got := metrictest.Counter(t, b.reader, MetricSkipped, "reason", "stored"); got != int64(stored) {
		t.Errorf("B skipped %d stored events, want %d", got, stored)
	}
	if got := metrictest.Counter(t, b.reader, MetricClaimed); got < int64(len(events)) {
		t.Errorf("B claimed %d entries, want at least %d", got, len(events))
	}
}

// TestStalledConsumerResumesAfterReclaim: A stored a batch and stalls before
// acknowledging; B reclaims and finishes; A resumes. Still exact.
func TestStalledConsumerResumesAfterReclaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := "stall" + rnd()
	events := e.mixed(code, 200)
	e.xadd(events...)
	q := allowAll(t)

	st := newStall()
	optsA := e.opts()
	optsA.hooks.afterInsert = st.hook
	a := e.start(optsA, e.rdb, e.store, q)
	st.await(t, "consumer A never inserted")
	e.start(e.opts(), e.rdb, e.store, q)
	w := expect(events)
	eventually(t, 20*time.Second, "B finishes while A stalls", func() (bool, string) {
		p, n := e.pending(), e.stats(code).GetCounts().GetTotal()
		return p == 0 && n == w.total, fmt.Sprintf("pending %d, total %d", p, n)
	})
	st.free()
	a.stop(t) // A acknowledges and flushes what it still held
	w.check(t, e.stats(code))
	if p := e.pending(); p != 0 {
		t.Errorf("pending %d after A resumed, want 0", p)
	}
	if got := e.rows(code); got != uint64(w.total) {
		t.Errorf("raw rows %d, want %d", got, w.total)
	}
}

// TestRacingInsertsCountOnce: A stalls just before inserting; B reclaims
// and stores the events; A resumes and stores its batch again. The rows are
// really duplicated, and every statistic still counts each click once.
func TestRacingInsertsCountOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := "race" + rnd()
	events := e.mixed(code, 200)
	e.xadd(events...)
	q := allowAll(t)

	st, aInserted := newStall(), make(chan int, 1)
	var after sync.Once
	// Every row A inserts: with two flushers, A may hold a second batch
	// behind the stall too, and insert both once freed.
	var aRows atomic.Int64
	optsA := e.opts()
	optsA.hooks.beforeInsert = st.hook
	optsA.hooks.afterInsert = func(_ context.Context, n int) {
		aRows.Add(int64(n))
		after.Do(func() { aInserted <- n })
	}
	a := e.start(optsA, e.rdb, e.store, q)
	st.await(t, "consumer A never reached its insert")
	e.start(e.opts(), e.rdb, e.store, q)
	w := expect(events)
	eventually(t, 20*time.Second, "B stores everything while A stalls", func() (bool, string) {
		p, n := e.pending(), e.rows(code)
		return p == 0 && n == uint64(w.total), fmt.Sprintf("pending %d, rows %d", p, n)
	})
	st.free()
	select {
	case <-aInserted:
	case <-time.After(20 * time.Second):
		t.Fatal("A never inserted after resuming")
	}
	a.stop(t) // A's flushes have all ended
	dup := aRows.Load()
	if got := e.rows(code); got != uint64(w.total+dup) || dup == 0 {
		t.Fatalf("raw rows %d, want %d + %d duplicates from A", got, w.total, dup)
	}
	w.check(t, e.stats(code))
}

// A healthy consumer whose inserts are slow (600 ms against a ClaimIdle of
// 1 s) under steady traffic is not stalled: it still takes over what a dead
// consumer held.
func TestSlowConsumerTakesOverADeadOnesEntries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := "slow" + rnd()
	e.xadd(e.mixed(code, 200)...)
	q := allowAll(t)
	e.crashAfterInsert(q, nil)
	dead := e.pending()
	if dead == 0 {
		t.Fatal("the dead consumer holds nothing")
	}

	traffic := time.NewTicker(100 * time.Millisecond)
	defer traffic.Stop()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-traffic.C:
				e.xadd(e.mixed(code+"x", 3)...)
			}
		}
	}()
	opts := e.opts()
	opts.hooks.beforeInsert = func(context.Context, int) { time.Sleep(600 * time.Millisecond) } // a slow ClickHouse
	b := e.start(opts, e.rdb, e.store, q)
	eventually(t, 20*time.Second, "the slow consumer claims the dead one's entries", func() (bool, string) {
		n := metrictest.Counter(t, b.reader, MetricClaimed)
		return n >= dead, fmt.Sprintf("claimed %d of %d", n, dead)
	})
}

// TestStalledConsumerClaimsNothing: a consumer stuck in an insert holds its
// entries past ClaimIdle. It must neither claim them back from itself (each
// claim is a delivery, and enough of them dead-letter good clicks) nor take
// anything from others; a healthy consumer takes its entries over and stores
// every click, none dead-lettered.
func TestStalledConsumerClaimsNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := "stall" + rnd()
	events := e.mixed(code, 200)
	e.xadd(events...)
	q := allowAll(t)

	st, skipped := newStall(), make(chan struct{}, 1)
	optsA := e.opts()
	optsA.hooks.beforeInsert = st.hook
	optsA.hooks.claimSkipped = func() {
		select {
		case skipped <- struct{}{}:
		default:
		}
	}
	a := e.start(optsA, e.rdb, e.store, q)
	st.await(t, "consumer A never reached its insert")
	// A's entries go idle while it is stuck: it must notice, tick after
	// tick, for longer than the default MaxDeliveries (5) self-claims take.
	for i := range 10 {
		select {
		case <-skipped:
		case <-time.After(20 * time.Second):
			t.Fatalf("stalled consumer A did not hold back its claims (%d ticks so far)", i)
		}
	}
	if n := metrictest.Counter(t, a.reader, MetricClaimed); n != 0 {
		t.Fatalf("stalled consumer A claimed %d entries", n)
	}

	b := e.start(e.opts(), e.rdb, e.store, q)
	w := expect(events)
	eventually(t, 20*time.Second, "B stores everything A holds", func() (bool, string) {
		p, n := e.pending(), e.rows(code)
		return p == 0 && n == uint64(w.total), fmt.Sprintf("pending %d, rows %d", p, n)
	})
	if n := metrictest.Counter(t, b.reader, MetricDeadLettered); n != 0 {
		t.Fatalf("B dead-lettered %d of the stalled consumer's clicks", n)
	}
	for _, k := range b.c.DeadLetterStreams() {
		if n, err := e.rdb.XLen(context.Background(), k).Result(); err != nil || n != 0 {
			t.Fatalf("dead-letter stream %s: %d entries (err %v), want 0", k, n, err)
		}
	}
	w.check(t, e.stats(code))
}

// TestClickHouseOutage runs the consumer through a proxy that the test cuts:
// nothing is acknowledged while ClickHouse is away, retries back off, and
// every click arrives once after it is back.
func TestClickHouseOutage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := "outage" + rnd()
	p, cutStore := e.cutClickHouse(t)

	// Each failing flush backs off on its own (two may be in flight):
	// attempt n waits RetryMin doubled n-1 times, at most RetryMax.
	type retry struct {
		attempt int
		wait    time.Duration
	}
	var mu sync.Mutex
	var retries []retry
	opts := e.opts()
	opts.UnhealthyAfter = 300 * time.Millisecond
	opts.InsertTimeout = 2 * time.Second
	opts.hooks.retry = func(n int, d time.Duration) { mu.Lock(); retries = append(retries, retry{n, d}); mu.Unlock() }
	capped := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(retries, func(r retry) bool { return r.wait == opts.RetryMax })
	}
	r := e.start(opts, e.rdb, cutStore, allowAll(t))
	events := e.mixed(code, 150)
	e.xadd(events...)

	eventually(t, 20*time.Second, "batches failing until a retry waits the most, entries pending", func() (bool, string) {
		f, pend := metrictest.Counter(t, r.reader, MetricFailures), e.pending()
		return f >= 5 && capped() && pend == int64(len(events)), fmt.Sprintf("failures %d, pending %d", f, pend)
	})
	if n := e.rows(code); n != 0 {
		t.Fatalf("%d rows reached ClickHouse through a cut proxy", n)
	}
	err := r.c.Ready(context.Background())
	if err == nil || !strings.Contains(err.Error(), "lag") {
		t.Errorf("Ready during the outage = %v, want an error with the lag", err)
	}
	mu.Lock()
	got := slices.Clone(retries)
	mu.Unlock()
	for _, r := range got {
		want := opts.RetryMin
		for range r.attempt - 1 {
			want = min(2*want, opts.RetryMax)
		}
		if r.wait != want {
			t.Errorf("a flush's attempt %d waited %s, want %s (doubling from %s, capped at %s; %d retries seen)",
				r.attempt, r.wait, want, opts.RetryMin, opts.RetryMax, len(got))
			break
		}
	}

	p.restore()
	w := expect(events)
	eventually(t, 20*time.Second, "everything stored once ClickHouse is back", func() (bool, string) {
		pend, n := e.pending(), e.stats(code).GetCounts().GetTotal()
		return pend == 0 && n == w.total, fmt.Sprintf("pending %d, total %d", pend, n)
	})
	w.check(t, e.stats(code))
	if n := e.rows(code); n != uint64(w.total) {
		t.Errorf("raw rows %d, want %d", n, w.total)
	}
	if err := r.c.Ready(context.Background()); err != nil {
		t.Errorf("Ready after recovery: %v", err)
	}
}

func TestPoisonEntriesAreDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := "poison" + rnd()
	r := e.start(e.opts(), e.rdb, e.store, allowAll(t))
	good := e.mixed(code, 40)
	e.xadd(good[:20]...)
	garbage := e.xaddRaw("foo", "bar")
	badTime := e.click(code, 0, visitor(1), chromeUA, "").Values()
	badTime[9] = "yesterday" // the ts field's value
	badTS := e.xaddRaw(badTime...)
	e.xadd(good[20:]...)

	w := expect(good)
	eventually(t, 20*time.Second, "good events stored, nothing pending", func() (bool, string) {
		p, n := e.pending(), e.stats(code).GetCounts().GetTotal()
		return p == 0 && n == w.total, fmt.Sprintf("pending %d, total %d", p, n)
	})
	w.check(t, e.stats(code))
	dead, err := e.rdb.XRange(context.Background(), e.prefix+"-dead"+e.streams()[0][len(e.prefix):], "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]string{}
	for _, m := range dead {
		if m.Values["stream"] != e.streams()[0] {
			t.Errorf("dead letter %v: stream %v, want %s", m.Values, m.Values["stream"], e.streams()[0])
		}
		reasons[fmt.Sprint(m.Values["entry_id"])] = fmt.Sprint(m.Values["reason"])
	}
	if !strings.Contains(reasons[garbage], "version") || !strings.Contains(reasons[badTS], "ts") || len(reasons) != 2 {
		t.Errorf("dead letters by entry: %v; want %s (version) and %s (ts)", reasons, garbage, badTS)
	}
	if got := metrictest.Counter(t, r.reader, MetricDeadLettered, "reason", "unparseable"); got != 2 {
		t.Errorf("%s = %d, want 2", MetricDeadLettered, got)
	}
}

// TestTooManyDeliveriesAreDeadLettered: an entry that kept failing (here,
// delivered six times to a consumer that vanished) is dead-lettered when
// claimed, not stored.
func TestTooManyDeliveriesAreDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	code := "retry" + rnd()
	key := e.streams()[0]
	if err := e.rdb.XGroupCreateMkStream(ctx, key, e.group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	id := e.xaddRaw(e.click(code, 0, visitor(1), chromeUA, "").Values()...)
	if err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: e.group, Consumer: "ghost", Streams: []string{key, ">"}, Count: 1, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.Do(ctx, "XCLAIM", key, e.group, "ghost", 0, id, "RETRYCOUNT", 6).Err(); err != nil {
		t.Fatal(err)
	}
	opts := e.opts()
	opts.MaxDeliveries = 5
	r := e.start(opts, e.rdb, e.store, allowAll(t))
	eventually(t, 20*time.Second, "entry dead-lettered", func() (bool, string) {
		n := metrictest.Counter(t, r.reader, MetricDeadLettered, "reason", "deliveries")
		return n == 1 && e.pending() == 0, fmt.Sprintf("dead-lettered %d, pending %d", n, e.pending())
	})
	dead, err := e.rdb.XRange(ctx, e.prefix+"-dead"+key[len(e.prefix):], "-", "+").Result()
	if err != nil || len(dead) != 1 {
		t.Fatalf("dead letters %v (%v), want 1", dead, err)
	}
	if reason := fmt.Sprint(dead[0].Values["reason"]); !strings.Contains(reason, "delivered 7 times") || dead[0].Values["entry_id"] != id {
		t.Errorf("dead letter %v: want entry %s, reason 'delivered 7 times'", dead[0].Values, id)
	}
	if n := e.rows(code); n != 0 {
		t.Errorf("%d rows stored for a dead-lettered entry", n)
	}
}

func TestFloodFlagging(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := "flood" + rnd()
	fake := limitertest.Start(t, countingLimiter(10))
	e.start(e.opts(), e.rdb, e.store, limiterClient(t, fake.Addr(), time.Second))
	var events []clickevent.Event
	for i := range 25 { // one visitor hammering the link
		events = append(events, e.click(code, time.Duration(i)*time.Second, visitor(0), chromeUA, ""))
	}
	for v := 1; v <= 3; v++ {
		for i := range 2 {
			events = append(events, e.click(code, time.Duration(v*10+i)*time.Second, visitor(v), iphoneUA, ""))
		}
	}
	for i := range 3 {
		events = append(events, e.click(code, time.Duration(i)*time.Second, visitor(99), botUA, ""))
	}
	e.xadd(events...)

	eventually(t, 20*time.Second, "flagged events stored", func() (bool, string) {
		p, n := e.pending(), e.stats(code).GetCounts().GetTotal()
		return p == 0 && n == int64(len(events)), fmt.Sprintf("pending %d, total %d", p, n)
	})
	c := e.stats(code).GetCounts()
	got := [5]int64{c.GetTotal(), c.GetHuman(), c.GetFlood(), c.GetBot(), c.GetUniqueVisitors()}
	if want := [5]int64{34, 16, 15, 3, 4}; got != want {
		t.Errorf("(total, human, flood, bot, unique visitors) = %v, want %v: 10 of the hammering visitor's 25 are human", got, want)
	}
	for _, call := range fake.Calls() {
		if call.GetDescriptors()["visitor"] == visitor(99) {
			t.Errorf("the limiter was asked about a bot: %v", call)
		}
	}
}

// The flood checks of a batch go up to FloodChecksPerCall to a CheckQuotas
// call: 250 visitors clicking once each are 250 checks in a few calls
// (however the consumer split the events into batches), none over 100.
func TestFloodChecksAreBatched(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := "fbatch" + rnd()
	fake := limitertest.Start(t, limitertest.AllowAll)
	opts := e.opts()
	opts.BatchSize = 1000
	e.start(opts, e.rdb, e.store, limiterClient(t, fake.Addr(), time.Second))
	var events []clickevent.Event
	for v := range 250 {
		events = append(events, e.click(code, time.Duration(v)*time.Millisecond, visitor(v), chromeUA, ""))
	}
	e.xadd(events...)
	eventually(t, 20*time.Second, "events stored", func() (bool, string) {
		p, n := e.pending(), e.stats(code).GetCounts().GetTotal()
		return p == 0 && n == 250, fmt.Sprintf("pending %d, total %d", p, n)
	})
	sizes := fake.Batches()
	sum := 0
	for _, n := range sizes {
		sum += n
		if n > FloodChecksPerCall {
			t.Errorf("a CheckQuotas call of %d checks, want at most %d", n, FloodChecksPerCall)
		}
	}
	if checks := len(fake.Calls()); checks != 250 || sum != 250 || len(sizes) > 25 {
		t.Errorf("%d checks, %d of them in %d CheckQuotas calls (%v); want all 250 in at most 25 calls", checks, sum, len(sizes), sizes)
	}
}

// ClickHouse writes an insert's block to the raw table before it pushes
// it to the materialized views, and keeps it when a view fails (too many
// parts, a memory limit): the insert is refused, the retry finds the rows
// stored and must not send them again, but the aggregates may lack them.
// That is counted apart from the ordinary duplicates (it was counted as
// "stored", and the clicks were gone from the statistics silently). A view
// of the test's own throws for the test's code.
func TestRowsKeptByARefusedInsertAreCountedApart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if clickstore.LayoutOf(e.cfg.ClickHouse).Cluster != "" {
		t.Skip("on a cluster inserts reach the shards' tables asynchronously: a view's failure does not refuse the insert")
	}
	code := "kept" + rnd()
	ctx := context.Background()
	target, view := "t_"+code, "t_"+code+"_mv"
	for _, q := range []string{
		"CREATE TABLE " + target + " (code String) ENGINE = MergeTree ORDER BY code",
		"CREATE MATERIALIZED VIEW " + view + " TO " + target + " AS SELECT code FROM " + clickstore.EventsTable +
			" WHERE throwIf(code = '" + code + "') = 0",
	} {
		if err := e.ch.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = e.ch.Exec(context.Background(), "DROP TABLE IF EXISTS "+view)
		_ = e.ch.Exec(context.Background(), "DROP TABLE IF EXISTS "+target)
	})
	r := e.start(e.opts(), e.rdb, e.store, allowAll(t))
	events := e.mixed(code, 12)
	e.xadd(events...)
	eventually(t, 20*time.Second, "the batch acknowledged", func() (bool, string) {
		p := e.pending()
		return p == 0 && e.rows(code) > 0, fmt.Sprintf("pending %d, raw rows %d", p, e.rows(code))
	})
	if got := e.rows(code); got != uint64(len(events)) {
		t.Errorf("raw rows %d, want %d: the refused insert's rows, not sent again", got, len(events))
	}
	if got := metrictest.Counter(t, r.reader, MetricSkipped, "reason", "kept_by_failed_insert"); got != int64(len(events)) {
		t.Errorf("%s{reason=kept_by_failed_insert} = %d, want %d", MetricSkipped, got, len(events))
	}
	if got := metrictest.Counter(t, r.reader, MetricSkipped, "reason", "stored"); got != 0 {
		t.Errorf("%s{reason=stored} = %d, want 0: these are not ordinary duplicates", MetricSkipped, got)
	}
}

func TestLimiterUnreachableStoresUnflagged(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := "nolim" + rnd()
	r := e.start(e.opts(), e.rdb, e.store, limiterClient(t, "127.0.0.1:1", 50*time.Millisecond))
	var events []clickevent.Event
	for i := range 20 {
		events = append(events, e.click(code, time.Duration(i)*time.Second, visitor(i%2), chromeUA, ""))
	}
	e.xadd(events...)
	eventually(t, 20*time.Second, "events stored", func() (bool, string) {
		p, n := e.pending(), e.stats(code).GetCounts().GetTotal()
		return p == 0 && n == 20, fmt.Sprintf("pending %d, total %d", p, n)
	})
	c := e.stats(code).GetCounts()
	if c.GetHuman() != 20 || c.GetFlood() != 0 || c.GetUniqueVisitors() != 2 {
		t.Errorf("counts %v: want 20 human, 0 flood, 2 visitors", c)
	}
	if got := metrictest.Counter(t, r.reader, MetricDegraded); got != 20 {
		t.Errorf("%s = %d, want 20", MetricDegraded, got)
	}
}

// A flood check the limiter answered by the rule's failure mode (its Redis
// slow or down) checked nothing: the clicks up to the rule's limit (10,
// reported with the answer) are stored unflagged and counted as degraded,
// whether the mode let them through or, configured closed, denied them
// (which would otherwise flag every one as a flood); the rest, more than one
// check ever lets through, are a flood.
func TestFailureModeAnswersStoreUnflagged(t *testing.T) {
	t.Parallel()
	for _, src := range []ratelimitv1.DecisionSource{ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_OPEN, ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED} {
		t.Run(src.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			code := "fmode" + rnd()
			fake := limitertest.Start(t, func(req *ratelimitv1.CheckQuotaRequest) *ratelimitv1.CheckQuotaResponse {
				allowed := src == ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_OPEN
				return &ratelimitv1.CheckQuotaResponse{Allowed: allowed, DecidingRule: "clicks/per-visitor", Limit: 10, Remaining: 0, Source: src}
			})
			// One batch: the bound holds per check, and the 20 clicks go
			// to the test's shards, read apart (two batches of 9 and 11
			// left 19 unflagged).
			opts := e.opts()
			opts.BatchAge = 2 * time.Second
			r := e.start(opts, e.rdb, e.store, limiterClient(t, fake.Addr(), time.Second))
			var events []clickevent.Event
			for i := range 20 {
				events = append(events, e.click(code, time.Duration(i)*time.Second, visitor(0), chromeUA, ""))
			}
			e.xadd(events...)
			eventually(t, 20*time.Second, "events stored", func() (bool, string) {
				p, n := e.pending(), e.stats(code).GetCounts().GetTotal()
				return p == 0 && n == 20, fmt.Sprintf("pending %d, total %d", p, n)
			})
			if c := e.stats(code).GetCounts(); c.GetHuman() != 10 || c.GetFlood() != 10 {
				t.Errorf("counts %v: want 10 human, 10 flood", c)
			}
			if got := metrictest.Counter(t, r.reader, MetricDegraded); got != 10 {
				t.Errorf("%s = %d, want 10", MetricDegraded, got)
			}
		})
	}
}

// loseFirstRead makes the first XREADGROUP of new entries that Redis
// answered with entries fail as a read timeout would: Redis delivered them
// (they are pending with the consumer), the consumer never got them.
type loseFirstRead struct{ lost atomic.Bool }

func (*loseFirstRead) DialHook(next redis.DialHook) redis.DialHook { return next }

// First-hand reads go to a stream's node in a pipeline with a WAIT
// (Options.ReadReplicas), others alone.
func (h *loseFirstRead) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if lost := h.lose(cmd); lost != nil && err == nil {
				err = lost
			}
		}
		return err
	}
}

func (h *loseFirstRead) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if lost := h.lose(cmd); lost != nil {
			err = lost
		}
		return err
	}
}

// lose turns the first successful first-hand read that returned entries
// into a read timeout, once.
func (h *loseFirstRead) lose(cmd redis.Cmder) error {
	args := cmd.Args()
	xr, ok := cmd.(*redis.XStreamSliceCmd)
	if ok && cmd.Err() == nil && cmd.Name() == "xreadgroup" && args[len(args)-1] == ">" &&
		len(xr.Val()) > 0 && len(xr.Val()[0].Messages) > 0 && h.lost.CompareAndSwap(false, true) {
		err := errors.New("read tcp 127.0.0.1:1->127.0.0.1:2: i/o timeout (the test lost this reply)")
		cmd.SetErr(err)
		return err
	}
	return nil
}

// Entries whose read reply was lost are pending with the consumer that does
// not hold them; with one consumer, nobody else would ever claim them (it
// takes its own idle entries for a stall). It reads them again.
func TestLostReadReplyIsReadAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := "lost" + rnd()
	rdb, _ := e.clients()
	h := &loseFirstRead{}
	rdb.AddHook(h)
	opts := e.opts()
	// First-hand reads go to the stream's node, on a client of its own.
	opts.hooks.readClient = func(c *redis.Client) { c.AddHook(h) }
	e.start(opts, rdb, e.store, allowAll(t))
	events := e.mixed(code, 40)
	e.xadd(events...)
	eventually(t, 20*time.Second, "every event stored, nothing pending", func() (bool, string) {
		p, n := e.pending(), e.stats(code).GetCounts().GetTotal()
		return p == 0 && n == int64(len(events)), fmt.Sprintf("pending %d, total %d of %d", p, n, len(events))
	})
	if !h.lost.Load() {
		t.Fatal("no read reply was lost: the test tested nothing")
	}
	expect(events).check(t, e.stats(code))
}

// A failover to a replica that missed a read delivers the read's entries
// first-hand again: the promoted replica's group has not delivered them.
// The first consumer reads with a WAIT for more replicas than each of the
// stack's masters has, so no read is acknowledged in time, as when the
// master is cut off from its replicas; then the group is set back to
// before the reads (XGROUP SETID 0), as the promoted replica holds it, and
// a second consumer, whose reads the replicas do acknowledge, reads every
// entry first-hand again. Both copies are stored; the stats count each
// click once, because the first copies are suspect.
func TestAReadNoReplicaHeldCountsOnceWhenDeliveredAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := "unrepl" + rnd()
	events := e.mixed(code, 120)
	w := expect(events)
	q := allowAll(t)

	optsA := e.opts()
	optsA.ReadReplicas, optsA.ReadWait = 2, 20*time.Millisecond
	a := e.start(optsA, e.rdb, e.store, q)
	e.xadd(events...)
	eventually(t, 20*time.Second, "A stores and acknowledges every event", func() (bool, string) {
		p, n := e.pending(), e.rows(code)
		return p == 0 && n == uint64(w.total), fmt.Sprintf("pending %d, raw rows %d of %d", p, n, w.total)
	})
	a.stop(t)
	if got := metrictest.Counter(t, a.reader, MetricUnreplicated); got != w.total {
		t.Errorf("A: %s = %d, want %d (every read waited for 2 replicas, each master has 1)", MetricUnreplicated, got, w.total)
	}

	for _, k := range e.streams() {
		if err := e.rdb.XGroupSetID(context.Background(), k, e.group, "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	optsB := e.opts()
	optsB.ReadWait = 5 * time.Second // WAIT answers as soon as the replica holds the read
	b := e.start(optsB, e.rdb, e.store, q)
	eventually(t, 20*time.Second, "B stores every event again, first-hand", func() (bool, string) {
		p, n := e.pending(), e.rows(code)
		return p == 0 && n == uint64(2*w.total), fmt.Sprintf("pending %d, raw rows %d of %d", p, n, 2*w.total)
	})
	if got := metrictest.Counter(t, b.reader, MetricUnreplicated); got != 0 {
		t.Errorf("B: %s = %d, want 0 (every master has the replica B waits for)", MetricUnreplicated, got)
	}
	w.check(t, e.stats(code))
}

// TestGracefulShutdownAcknowledges: a batch still collecting when the
// consumer is told to stop is stored and acknowledged before Run returns.
func TestGracefulShutdownAcknowledges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := "drain" + rnd()
	opts := e.opts()
	opts.BatchAge, opts.BatchSize = time.Minute, 10_000
	r := e.start(opts, e.rdb, e.store, allowAll(t))
	events := e.mixed(code, 60)
	e.xadd(events...)
	eventually(t, 10*time.Second, "entries delivered into the open batch", func() (bool, string) {
		p := e.pending()
		return p == int64(len(events)), fmt.Sprintf("pending %d", p)
	})
	if n := e.rows(code); n != 0 {
		t.Fatalf("%d rows stored before the batch was due", n)
	}
	r.stop(t)
	if p := e.pending(); p != 0 {
		t.Errorf("pending %d after a graceful stop, want 0", p)
	}
	if n := e.memberships(opts.Name); n != 0 {
		t.Errorf("the stopped consumer is still in the group of %d streams, want none (it holds nothing)", n)
	}
	expect(events).check(t, e.stats(code))
}

// TestStopWithPendingEntriesStaysInTheGroup: a consumer that stops with
// entries it could not store (ClickHouse unreachable) stays in the group,
// so they stay pending for another consumer to claim, and none is lost.
func TestStopWithPendingEntriesStaysInTheGroup(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := "stays" + rnd()
	p, cutStore := e.cutClickHouse(t)
	opts := e.opts()
	opts.InsertTimeout, opts.DrainTimeout = time.Second, time.Second
	r := e.start(opts, e.rdb, cutStore, allowAll(t))
	events := e.mixed(code, 40)
	e.xadd(events...)
	eventually(t, 10*time.Second, "entries delivered and not stored", func() (bool, string) {
		pend := e.pending()
		return pend == int64(len(events)), fmt.Sprintf("pending %d", pend)
	})
	r.stop(t)
	if pend := e.pending(); pend != int64(len(events)) {
		t.Fatalf("pending %d after a stop that could not store, want %d", pend, len(events))
	}
	if n := e.memberships(opts.Name); n == 0 {
		t.Error("the consumer left the group with its entries pending: they would be dropped")
	}
	p.restore()
	opts.Name = "c-" + rnd()
	e.start(opts, e.rdb, e.store, allowAll(t))
	w := expect(events)
	eventually(t, 20*time.Second, "another consumer claims and stores them", func() (bool, string) {
		pend, n := e.pending(), e.stats(code).GetCounts().GetTotal()
		return pend == 0 && n == w.total, fmt.Sprintf("pending %d, total %d", pend, n)
	})
	w.check(t, e.stats(code))
}

// TestAConsumerKilledWithoutStoppingIsForgotten: a consumer that never
// left (a process killed) is removed from every shard's group by a running
// one once ForgetIdle has passed; the running one stays.
func TestAConsumerKilledWithoutStoppingIsForgotten(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ghost := "killed-" + rnd()
	for _, key := range e.streams() {
		if err := e.rdb.XGroupCreateMkStream(ctx, key, e.group, "0").Err(); err != nil {
			t.Fatal(err)
		}
		if err := e.rdb.XGroupCreateConsumer(ctx, key, e.group, ghost).Err(); err != nil {
			t.Fatal(err)
		}
	}
	opts := e.opts()
	opts.ForgetIdle = 2 * time.Second // ten times ReadBlock: the live consumer reads more often
	e.start(opts, e.rdb, e.store, allowAll(t))
	eventually(t, 15*time.Second, "the killed consumer forgotten", func() (bool, string) {
		n := e.memberships(ghost)
		return n == 0, fmt.Sprintf("in the group of %d streams", n)
	})
	if n := e.memberships(opts.Name); n != len(e.streams()) {
		t.Errorf("the running consumer is in the group of %d of %d streams: it forgot itself", n, len(e.streams()))
	}
}

// TestRulesAndVariantsReachTheStats: the rule and variant a click event
// names (and an event without them, as an older redirect writes) are
// stored and counted per rule and per variant.
func TestRulesAndVariantsReachTheStats(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	code := "rul" + rnd()
	var events []clickevent.Event
	for i := range 6 {
		ev := e.click(code, time.Duration(i)*time.Second, visitor(i), chromeUA, "")
		switch {
		case i < 2:
			ev.Rule = "de"
		case i < 5:
			ev.Variant = []string{"a", "b", "a"}[i-2]
		}
		events = append(events, ev)
	}
	e.start(e.opts(), e.rdb, e.store, allowAll(t))
	e.xadd(events...)
	eventually(t, 20*time.Second, "all events stored", func() (bool, string) {
		n := e.stats(code).GetCounts().GetTotal()
		return n == 6, fmt.Sprintf("total %d", n)
	})
	resp := e.stats(code)
	got := func(list []*analyticsv1.KeyCount) map[string]int64 {
		m := map[string]int64{}
		for _, kc := range list {
			m[kc.GetKey()] = kc.GetCount()
		}
		return m
	}
	if r, v := got(resp.GetRules()), got(resp.GetVariants()); len(r) != 1 || r["de"] != 2 || len(v) != 2 || v["a"] != 2 || v["b"] != 1 {
		t.Fatalf("rules %v variants %v; want de: 2, and a: 2, b: 1", r, v)
	}
}
