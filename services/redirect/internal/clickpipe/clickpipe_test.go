package clickpipe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/testkit/metrictest"
	"kurz.dev/pkg/testkit/servertest"
)

// fakeStreams takes the pipeline's XADD batches. Any Redis call other than
// Pipeline panics (the nil embedded interface), so a test notices a
// pipeline that starts making one.
type fakeStreams struct {
	redis.Cmdable
	mu      sync.Mutex
	batches [][]*redis.XAddArgs // what each Exec was sent
	// fail, if set, says which XADDs of a batch (by index) fail.
	fail func(i int) bool
	// reply, if set, is the error reply (nil: none) of XADD i of the
	// exec-th Exec (from 0).
	reply func(exec, i int) error
	// hold, if set, makes Exec wait until it is closed or Exec's context
	// ends; entered, if set, is sent each batch's size as its Exec starts.
	hold    chan struct{}
	entered chan int
}

func (f *fakeStreams) Pipeline() redis.Pipeliner { return &fakePipe{f: f} }

// events returns how many events every Exec so far was sent.
func (f *fakeStreams) events() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, b := range f.batches {
		n += len(b)
	}
	return n
}

func (f *fakeStreams) sent() [][]*redis.XAddArgs {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.batches)
}

type fakePipe struct {
	redis.Pipeliner
	f    *fakeStreams
	adds []*redis.XAddArgs
	cmds []*redis.StringCmd
}

func (p *fakePipe) XAdd(ctx context.Context, a *redis.XAddArgs) *redis.StringCmd {
	cmd := redis.NewStringCmd(ctx, "xadd", a.Stream)
	p.adds, p.cmds = append(p.adds, a), append(p.cmds, cmd)
	return cmd
}

var errXAdd = errors.New("OOM command not allowed")

func (p *fakePipe) Exec(ctx context.Context) ([]redis.Cmder, error) {
	f := p.f
	if f.entered != nil {
		f.entered <- len(p.adds)
	}
	var cut, err error // cut: the context ended; err: the first failure
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-ctx.Done():
			cut, err = ctx.Err(), ctx.Err()
		}
	}
	f.mu.Lock()
	exec := len(f.batches)
	f.batches = append(f.batches, p.adds)
	f.mu.Unlock()
	out := make([]redis.Cmder, len(p.cmds))
	for i, c := range p.cmds {
		var rerr error
		if f.reply != nil {
			rerr = f.reply(exec, i)
		}
		switch {
		case cut != nil:
			c.SetErr(cut)
		case f.fail != nil && f.fail(i):
			c.SetErr(errXAdd)
			err = errXAdd
		case rerr != nil:
			c.SetErr(rerr)
			err = cmp.Or(err, rerr)
		default:
			c.SetVal(fmt.Sprintf("%d-0", i))
		}
		out[i] = c
	}
	return out, err
}

// replyError is a node's error reply, as go-redis gives it (redis.Error).
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// Events a node refused unrun (CLUSTERDOWN from a node removed from the
// cluster, TRYAGAIN) are sent again after the slot map's reload, not
// dropped; an error after which an event may have been appended (OOM
// here stands for any other) is not resent. In a fault test a master's
// removal (del-node) lost five clicks to CLUSTERDOWN.
func TestEventsRefusedUnrunAreSentAgain(t *testing.T) {
	rdb := &fakeStreams{reply: func(exec, i int) error {
		switch {
		case exec == 0 && i == 0:
			return replyError("CLUSTERDOWN Hash slot not served")
		case exec == 0 && i == 1:
			return replyError("OOM command not allowed when used memory > 'maxmemory'.")
		case exec == 0 && i == 2, exec == 1 && i == 1: // id-2, twice
			return replyError("TRYAGAIN Multiple keys request during rehashing of slot")
		}
		return nil
	}}
	reloads := make(chan struct{}, 10)
	cfg := config()
	cfg.Batch = 4
	cfg.NodeFailed = func() { reloads <- struct{}{} }
	p, reader := start(t, cfg, rdb)
	for i := range 4 {
		p.Record(event(i))
	}
	// A flush counts what it wrote, then what it dropped.
	awaitCounter(t, reader, 1, dropped, "reason", "redis")
	if got := metrictest.Counter(t, reader, written); got != 3 {
		t.Errorf("written %d, want 3 (all but the OOM)", got)
	}
	var sent [][]string
	for _, b := range rdb.sent() {
		var ids []string
		for _, a := range b {
			ids = append(ids, a.Values.([]any)[3].(string))
		}
		sent = append(sent, ids)
	}
	want := [][]string{{"id-0", "id-1", "id-2", "id-3"}, {"id-0", "id-2"}, {"id-2"}}
	if !reflect.DeepEqual(sent, want) {
		t.Errorf("pipelines sent %v, want %v", sent, want)
	}
	if len(reloads) != 2 {
		t.Errorf("%d slot map reloads, want one before each resend (2)", len(reloads))
	}
}

// config is one shard (one writer, so batches are deterministic), a linger
// no test waits for unless it sets its own, and a roomy buffer.
func config() Config {
	return Config{Streams: clickevent.StreamConfig{Shards: 1, MaxLen: 5000}, Buffer: 100, Batch: 100,
		Linger: time.Hour, WriteTimeout: time.Minute}
}

func start(t *testing.T, cfg Config, rdb *fakeStreams) (*Pipeline, *sdkmetric.ManualReader) {
	t.Helper()
	reader, meter := metrictest.New()
	p, err := New(cfg, rdb, slog.New(slog.DiscardHandler), meter)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p, reader
}

func event(i int) clickevent.Event {
	return clickevent.Event{ID: fmt.Sprintf("id-%d", i), Code: "abc", Tenant: "acme", Time: time.UnixMilli(int64(i))}
}

const (
	written = "kurz.redirect.click_events.written"
	dropped = "kurz.redirect.click_events.dropped"
)

// awaitCounter waits until the counter (with attr) reaches want: the
// writers count a batch after its round trip.
func awaitCounter(t *testing.T, r *sdkmetric.ManualReader, want int64, name string, attr ...string) {
	t.Helper()
	if !servertest.Eventually(10*time.Second, func() bool { return metrictest.Counter(t, r, name, attr...) >= want }) {
		t.Fatalf("%s %v: %d, want %d", name, attr, metrictest.Counter(t, r, name, attr...), want)
	}
	if got := metrictest.Counter(t, r, name, attr...); got != want {
		t.Fatalf("%s %v: %d, want %d", name, attr, got, want)
	}
}

// A full batch goes at once, without waiting for the linger, as one
// pipeline of XADDs to the shard's stream, trimmed to about MaxLen.
func TestAFullBatchIsOnePipeline(t *testing.T) {
	cfg := config()
	cfg.Batch = 4
	rdb := &fakeStreams{}
	p, reader := start(t, cfg, rdb)
	for i := range 4 {
		p.Record(event(i))
	}
	awaitCounter(t, reader, 4, written)
	batches := rdb.sent()
	if len(batches) != 1 || len(batches[0]) != 4 {
		t.Fatalf("sent %d batches (%v), want one of 4", len(batches), batches)
	}
	key := clickevent.StreamKeys(1)[0]
	for i, a := range batches[0] {
		if a.Stream != key || a.MaxLen != 5000 || !a.Approx || a.ID != "*" || !slices.Equal(a.Values.([]any), event(i).Args()) {
			t.Errorf("XADD %d: %+v, want stream %s, MAXLEN ~ 5000, ID *, the event's values", i, a, key)
		}
	}
}

// A batch that does not fill up goes when the linger passes.
func TestLingerSendsAPartialBatch(t *testing.T) {
	cfg := config()
	cfg.Linger = 10 * time.Millisecond
	rdb := &fakeStreams{}
	p, reader := start(t, cfg, rdb)
	for i := range 3 {
		p.Record(event(i))
	}
	awaitCounter(t, reader, 3, written)
	if got := rdb.events(); got != 3 {
		t.Errorf("sent %d events, want 3", got)
	}
}

// Close sends what is buffered before it returns.
func TestCloseFlushesTheBuffer(t *testing.T) {
	rdb := &fakeStreams{}
	p, reader := start(t, config(), rdb)
	for i := range 5 {
		p.Record(event(i))
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := rdb.events(); got != 5 {
		t.Errorf("sent %d events by Close, want 5", got)
	}
	if got := metrictest.Counter(t, reader, written); got != 5 {
		t.Errorf("written %d, want 5", got)
	}
}

// With the writer stuck on Redis and the buffer full, Record drops and
// counts instead of blocking the redirect; what was buffered still goes.
func TestAFullBufferDropsAndCounts(t *testing.T) {
	cfg := config()
	cfg.Batch, cfg.Buffer = 1, 2
	rdb := &fakeStreams{hold: make(chan struct{}), entered: make(chan int, 10)}
	p, reader := start(t, cfg, rdb)
	p.Record(event(0))
	<-rdb.entered // the writer holds event 0 in a stuck Exec
	for i := 1; i <= 4; i++ {
		p.Record(event(i)) // 1 and 2 fill the buffer; 3 and 4 are dropped
	}
	if got := metrictest.Counter(t, reader, dropped, "reason", "buffer_full"); got != 2 {
		t.Errorf("dropped buffer_full %d, want 2", got)
	}
	close(rdb.hold)
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	var ids []string
	for _, b := range rdb.sent() {
		for _, a := range b {
			ids = append(ids, a.Values.([]any)[3].(string))
		}
	}
	if want := []string{"id-0", "id-1", "id-2"}; !slices.Equal(ids, want) {
		t.Errorf("sent %v, want %v", ids, want)
	}
	if got := metrictest.Counter(t, reader, written); got != 3 {
		t.Errorf("written %d, want 3", got)
	}
}

// XADDs that fail are dropped and counted as reason=redis; the rest of
// their batch counts as written.
func TestFailedXADDsAreCounted(t *testing.T) {
	cfg := config()
	cfg.Batch = 4
	rdb := &fakeStreams{fail: func(i int) bool { return i%2 == 1 }}
	p, reader := start(t, cfg, rdb)
	for i := range 4 {
		p.Record(event(i))
	}
	awaitCounter(t, reader, 2, dropped, "reason", "redis")
	if got := metrictest.Counter(t, reader, written); got != 2 {
		t.Errorf("written %d, want 2", got)
	}
}

// Close gives up when its context ends: the write in flight is cut, its
// events counted as dropped, and Close says the flush was cut short.
func TestCloseIsBoundedByItsContext(t *testing.T) {
	rdb := &fakeStreams{hold: make(chan struct{}), entered: make(chan int, 10)} // Redis never answers
	cfg := config()
	cfg.Batch = 1
	p, reader := start(t, cfg, rdb)
	p.Record(event(0))
	<-rdb.entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := p.Close(ctx)
	if err == nil || !strings.Contains(err.Error(), "flush cut short") {
		t.Fatalf("Close with an ended context: %v, want the flush cut short", err)
	}
	if got := metrictest.Counter(t, reader, dropped, "reason", "redis"); got != 1 {
		t.Errorf("dropped redis %d, want 1 (the cut write)", got)
	}
}

// Both drop series exist from the start at 0, so an alert on their rate
// sees "no drops", not "no data".
func TestDropSeriesStartAtZero(t *testing.T) {
	_, reader := start(t, config(), &fakeStreams{})
	for _, reason := range []string{"buffer_full", "redis"} {
		if !metrictest.Series(t, reader, dropped, "reason", reason) {
			t.Errorf("no %s series with reason=%s", dropped, reason)
		}
		if got := metrictest.Counter(t, reader, dropped, "reason", reason); got != 0 {
			t.Errorf("%s reason=%s: %d, want 0", dropped, reason, got)
		}
	}
}
