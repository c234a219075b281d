// Package consumer moves click events from the Redis click streams into
// ClickHouse.
//
// One process is one consumer of a consumer group on every shard stream: a
// reader goroutine per shard (XREADGROUP), one batcher that flushes at a size
// or an age, and a maintenance loop that reclaims entries other consumers
// left pending (XAUTOCLAIM), dead-letters entries delivered too often, and
// measures the lag. A flush classifies the events (bots from the User-Agent,
// floods from the limiter, first visits of the day from Redis), inserts them
// in one ClickHouse batch, and only then acknowledges them (XACK): delivery
// is at-least-once, and clickstore makes the counts exact anyway.
//
// While ClickHouse refuses a batch the batcher keeps it, retries with
// exponential backoff and reads nothing more (the readers block on a small
// channel), so memory stays bounded and nothing is acknowledged.
package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/services/analytics/internal/clickstore"
)

// DefaultStreamPrefix is the stream key prefix of the click stream contract:
// shard keys are "clicks:{<tag>}" (clickevent.StreamKeys).
const DefaultStreamPrefix = "clicks"

// DefaultGroup is the consumer group every analytics process joins.
const DefaultGroup = "analytics"

// FloodDomain is the limiter domain of the click-flood rule (per code and
// visitor).
const FloodDomain = "clicks"

// Options configure a Consumer. Zero values take the defaults noted.
type Options struct {
	// Shards is the number of click stream shards (KURZ_CLICK_STREAM_SHARDS).
	Shards int
	// StreamPrefix replaces "clicks" in the stream keys; the shard's hash
	// tag stays, so a test's streams land on the same slots.
	StreamPrefix string
	// Group is the consumer group (default DefaultGroup).
	Group string
	// GroupStart is where a newly created group starts: "0" (default) reads
	// what the streams already hold, "$" only what comes next.
	GroupStart string
	// Name is this consumer's name in the group; default host-pid-random.
	// A stable name lets a restarted process resume its own pending entries
	// at once instead of after ClaimIdle.
	Name string
	// BatchSize flushes a batch at this many entries (default 5000).
	BatchSize int
	// BatchAge flushes a batch this long after its first entry (default 1s).
	BatchAge time.Duration
	// ReadCount is the most entries one XREADGROUP returns (default
	// min(BatchSize, 1000)).
	ReadCount int
	// ReadBlock is how long an XREADGROUP waits for new entries (default
	// 1s); it also bounds how long a reader takes to notice shutdown.
	ReadBlock time.Duration
	// ReadReplicas is how many replicas of a stream's master must hold a
	// first-hand read (the group's record that it delivered the entries)
	// within ReadWait for its entries to be stored as not suspect: the
	// read and a WAIT go to the master in one round trip. A failover to a
	// replica without the read delivers the entries first-hand again, and
	// only a suspect first copy lets the queries count them once. 0 sends
	// no WAIT (a Redis without replicas, which cannot fail over).
	ReadReplicas int
	// ReadWait bounds the WAIT after a first-hand read (default 100ms).
	ReadWait time.Duration
	// ClaimIdle is how long an entry stays pending with a consumer before
	// another may claim it (default 30s).
	ClaimIdle time.Duration
	// ClaimEvery is how often pending entries are looked for (default
	// ClaimIdle/4, at most 5s).
	ClaimEvery time.Duration
	// ForgetIdle removes from the group, on each maintenance tick, the
	// other consumers idle this long with nothing pending (default 1h): a
	// process killed without stopping (OOM, a lost node) cannot leave, and
	// would stay listed for good. A live consumer reads at least every
	// ReadBlock, so it is never that idle.
	ForgetIdle time.Duration
	// MaxDeliveries dead-letters an entry claimed after this many deliveries
	// (default 5).
	MaxDeliveries int
	// RetryMin and RetryMax bound the backoff between failed flushes
	// (defaults 100ms and 5s).
	RetryMin, RetryMax time.Duration
	// InsertTimeout bounds one ClickHouse insert or lookup (default 10s).
	InsertTimeout time.Duration
	// FloodParallelism bounds the CheckQuotas calls in flight over all the
	// consumer's batches, each of up to FloodChecksPerCall flood checks
	// (default 16); fewer while the limiter answers by its failure mode
	// (pacer).
	FloodParallelism int
	// Flushers is how many batches are flushed at once (default 2): one
	// can wait on ClickHouse while the next asks the limiter and Redis.
	// The consumer holds up to Flushers+1 batches in memory.
	Flushers int
	// UnhealthyAfter makes Ready fail once flushes have been failing this
	// long (default 30s).
	UnhealthyAfter time.Duration
	// DrainTimeout bounds the last flush after Run's context ends (default
	// 10s); what is not acknowledged by then stays pending for others.
	DrainTimeout time.Duration
	// DeadLetterMaxLen trims each dead-letter stream (default 100000).
	DeadLetterMaxLen int64
	// TracerProvider records one span per flushed batch, linked to the
	// redirect spans of its clicks (from each event's traceparent). Nil:
	// the global provider.
	TracerProvider trace.TracerProvider

	// hooks are for this package's tests only; configuration never sets them.
	hooks hooks
}

type hooks struct {
	// beforeInsert and afterInsert run around a successful ClickHouse insert.
	beforeInsert func(ctx context.Context, rows int)
	afterInsert  func(ctx context.Context, rows int)
	// retry runs before each backoff wait of a failing flush, with the
	// flush's attempt (1 before its second): flushes in flight at once
	// back off each on its own.
	retry func(attempt int, wait time.Duration)
	// claimSkipped runs when a maintenance tick takes nothing from other
	// consumers because this one is failing or stalled.
	claimSkipped func()
	// readClient runs on the node client of each first-hand read, before
	// the read (a client WithTimeout returns has no hooks of its own).
	readClient func(*redis.Client)
}

func (o Options) withDefaults() (Options, error) {
	if o.Shards < 1 || o.Shards > clickevent.MaxShards {
		return o, fmt.Errorf("consumer: %d shards: want 1 to %d", o.Shards, clickevent.MaxShards)
	}
	set := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if o.StreamPrefix == "" {
		o.StreamPrefix = DefaultStreamPrefix
	}
	if o.Group == "" {
		o.Group = DefaultGroup
	}
	if o.GroupStart == "" {
		o.GroupStart = "0"
	}
	if o.Name == "" {
		o.Name = defaultName()
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 5000
	}
	set(&o.BatchAge, time.Second)
	if o.ReadCount <= 0 {
		o.ReadCount = min(o.BatchSize, 1000)
	}
	set(&o.ReadBlock, time.Second)
	set(&o.ReadWait, 100*time.Millisecond)
	if o.ReadReplicas < 0 {
		return o, fmt.Errorf("consumer: %d read replicas: want 0 or more", o.ReadReplicas)
	}
	set(&o.ClaimIdle, 30*time.Second)
	set(&o.ClaimEvery, min(o.ClaimIdle/4, 5*time.Second))
	set(&o.ForgetIdle, time.Hour)
	if o.MaxDeliveries <= 0 {
		o.MaxDeliveries = 5
	}
	set(&o.RetryMin, 100*time.Millisecond)
	set(&o.RetryMax, 5*time.Second)
	set(&o.InsertTimeout, 10*time.Second)
	if o.FloodParallelism <= 0 {
		o.FloodParallelism = 16
	}
	if o.Flushers <= 0 {
		o.Flushers = 2
	}
	set(&o.UnhealthyAfter, 30*time.Second)
	set(&o.DrainTimeout, 10*time.Second)
	if o.DeadLetterMaxLen <= 0 {
		o.DeadLetterMaxLen = 100_000
	}
	return o, nil
}

func defaultName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "analytics"
	}
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// QuotaChecker is the limiter client (*quota.Client).
type QuotaChecker interface {
	CheckMany(ctx context.Context, reqs []quota.Request, policy quota.Policy) []quota.Decision
}

// Consumer is one process's membership in the consumer group. Run it once.
type Consumer struct {
	opts  Options
	rdb   redis.UniversalClient
	lags  *clickevent.Lags // used by maintain only
	store *clickstore.Store
	quota QuotaChecker
	log   *slog.Logger
	m     *metrics
	// tracer makes one span per flushed batch.
	tracer trace.Tracer
	// pace bounds the flood-check calls in flight over every batch.
	pace *pacer
	// floodLimit is the flood rule's limit as the limiter last reported
	// it (0 until it has): the most clicks of one (code, visitor) a
	// check it did not answer leaves unflagged.
	floodLimit atomic.Int64

	keys, deadKeys []string
	in             chan []entry

	mu           sync.Mutex
	failingSince time.Time
	lastErr      error
	lag          []ShardLag
}

// entry is one stream entry as read.
type entry struct {
	shard  int
	id     string
	values map[string]any
	// redelivered is true for entries this consumer did not read first
	// (claimed, or from its own pending list after a restart).
	redelivered bool
	// unreplicated is true for entries read first-hand by a read fewer
	// than ReadReplicas replicas acknowledged: a failover may deliver them
	// first-hand again.
	unreplicated bool
	readAt       time.Time
}

// New returns a consumer; it touches nothing until Run.
func New(rdb redis.UniversalClient, store *clickstore.Store, q QuotaChecker, log *slog.Logger, mp metric.MeterProvider, opts Options) (*Consumer, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Consumer{opts: opts, rdb: rdb, lags: clickevent.NewLags(rdb, opts.Group), store: store, quota: q, log: log.With("consumer", opts.Name, "group", opts.Group), pace: newPacer(opts.FloodParallelism)}
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	c.tracer = tp.Tracer("kurz.dev/services/analytics/consumer")
	for _, k := range clickevent.StreamKeys(opts.Shards) {
		tag := strings.TrimPrefix(k, DefaultStreamPrefix) // ":{<tag>}"
		c.keys = append(c.keys, opts.StreamPrefix+tag)
		c.deadKeys = append(c.deadKeys, opts.StreamPrefix+"-dead"+tag)
	}
	if c.m, err = newMetrics(mp, c); err != nil {
		return nil, err
	}
	return c, nil
}

// Name is the consumer's name in the group.
func (c *Consumer) Name() string { return c.opts.Name }

// DeadLetterStreams returns the dead-letter stream keys, one per shard.
func (c *Consumer) DeadLetterStreams() []string { return append([]string(nil), c.deadKeys...) }

// Run consumes until ctx ends, then stops reading, flushes and acknowledges
// what it holds (bounded by DrainTimeout) and returns.
func (c *Consumer) Run(ctx context.Context) {
	c.in = make(chan []entry, len(c.keys))
	// hard ends DrainTimeout after ctx: the bound of the final flush.
	hard, cancelHard := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHard()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(c.opts.DrainTimeout, cancelHard) })
	defer stop()

	var producers sync.WaitGroup
	for shard := range c.keys {
		producers.Go(func() { c.read(ctx, hard, shard) })
	}
	producers.Go(func() { c.maintain(ctx, hard) })
	go func() { producers.Wait(); close(c.in) }()
	c.log.Info("click consumer started", "streams", len(c.keys), "batch_size", c.opts.BatchSize,
		"batch_age", c.opts.BatchAge, "claim_idle", c.opts.ClaimIdle)
	c.batch(hard)
	cancelHard()
	producers.Wait()
	c.leave(context.WithoutCancel(ctx))
	c.log.Info("click consumer stopped")
}

// leave removes this consumer from each shard's group where it holds no
// pending entry (all acknowledged): consumers are named per process, so
// every restart would otherwise leave one more idle consumer in the group
// for good. A consumer with entries pending stays, as deleting it would
// drop them from the group: another consumer claims them (maintain).
func (c *Consumer) leave(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := clickevent.LeaveGroup(ctx, c.rdb, c.keys, c.opts.Group, c.opts.Name); err != nil {
		c.log.Warn("leaving the click group", "err", err)
	}
}

// read is one shard's reader: first this consumer's own pending entries
// (left by a previous process of the same name, or by a read whose reply
// was lost), then new ones.
func (c *Consumer) read(ctx, hard context.Context, shard int) {
	key := c.keys[shard]
	bo := c.backoff()
	for !c.ensureGroup(ctx, key) {
		if !sleep(ctx, bo.next()) {
			return
		}
	}
	bo.reset()
	pendingFrom := "0"
	for ctx.Err() == nil {
		args := &redis.XReadGroupArgs{Group: c.opts.Group, Consumer: c.opts.Name, Count: int64(c.opts.ReadCount)}
		if pendingFrom != "" {
			args.Streams, args.Block = []string{key, pendingFrom}, -1
		} else {
			args.Streams, args.Block = []string{key, ">"}, c.opts.ReadBlock
		}
		res, replicated, err := c.readGroup(ctx, args)
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, redis.ErrClosed) {
				return
			}
			if strings.HasPrefix(err.Error(), "NOGROUP") {
				c.ensureGroup(ctx, key)
			}
			// Redis may have delivered entries whose reply never arrived (a
			// read timeout): they are pending with this consumer, which
			// does not hold them, and, since it takes its own idle entries
			// for a stall, would never claim them back. Read this consumer's
			// pending entries again; those it does hold are redelivered
			// copies, which the store counts once.
			pendingFrom = "0"
			wait := bo.next()
			c.log.Warn("click stream read failed", "stream", key, "retry_in", wait, "err", err)
			if !sleep(ctx, wait) {
				return
			}
			continue
		}
		bo.reset()
		var msgs []redis.XMessage
		if len(res) > 0 {
			msgs = res[0].Messages
		}
		redelivered := pendingFrom != ""
		if redelivered {
			if len(msgs) == 0 {
				pendingFrom = ""
				continue
			}
			pendingFrom = msgs[len(msgs)-1].ID
		}
		if len(msgs) == 0 {
			continue
		}
		es := toEntries(shard, msgs, redelivered)
		if !replicated {
			c.m.unreplicated(shard, len(es))
			for i := range es {
				es[i].unreplicated = true
			}
		}
		if !c.send(hard, es) {
			return
		}
	}
}

// readGroup is one XREADGROUP. A first-hand read (">") goes with a WAIT
// for ReadReplicas replicas to the master of its stream, in one round
// trip on one connection (WAIT waits for its own connection's writes);
// replicated says whether they acknowledged it in time. Replication is
// asynchronous: a replica promoted before it received the read's effect
// on the group (which entries were delivered) delivers them first-hand
// again, and both copies would count. Entries of a read the replicas did
// not acknowledge are stored as suspect instead, so the queries count
// them once whichever copies exist. Every other read is of entries
// delivered before, already suspect, and needs no WAIT.
func (c *Consumer) readGroup(ctx context.Context, args *redis.XReadGroupArgs) (res []redis.XStream, replicated bool, err error) {
	kn, ok := c.rdb.(redisconn.KeyNodes)
	if c.opts.ReadReplicas == 0 || args.Streams[1] != ">" || !ok {
		res, err = c.rdb.XReadGroup(ctx, args).Result()
		return res, true, err
	}
	node, err := kn.MasterForKey(ctx, args.Streams[0])
	if err != nil {
		return nil, false, fmt.Errorf("redis node of %s: %w", args.Streams[0], err)
	}
	res, replicated, err = c.readWait(ctx, node, args, false)
	// The stream's slot has moved (MOVED) or is moving (ASK): the node
	// refused the read, which delivered nothing; read where it says.
	ask, addr, moved := redisconn.Redirection(err)
	if !moved {
		return res, replicated, err
	}
	if node, err = redisconn.MasterAt(ctx, kn, addr); err != nil {
		return nil, false, err
	}
	return c.readWait(ctx, node, args, ask)
}

// readWait is XREADGROUP and WAIT on node, after ASKING if asking.
func (c *Consumer) readWait(ctx context.Context, node *redis.Client, args *redis.XReadGroupArgs, asking bool) ([]redis.XStream, bool, error) {
	// A pipeline reads its replies within the client's socket timeout,
	// which a blocking read's wait must not count against.
	node = node.WithTimeout(args.Block + c.opts.ReadWait + node.Options().ReadTimeout)
	if h := c.opts.hooks.readClient; h != nil {
		h(node)
	}
	var read *redis.XStreamSliceCmd
	var wait *redis.Cmd
	_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
		if asking {
			p.Do(ctx, "ASKING")
		}
		read = p.XReadGroup(ctx, args)
		wait = p.Do(ctx, "WAIT", c.opts.ReadReplicas, c.opts.ReadWait.Milliseconds())
		return nil
	})
	res, err := read.Result()
	if err != nil {
		return nil, false, err
	}
	held, err := wait.Int64()
	return res, err == nil && held >= int64(c.opts.ReadReplicas), nil
}

func toEntries(shard int, msgs []redis.XMessage, redelivered bool) []entry {
	now := time.Now()
	out := make([]entry, len(msgs))
	for i, m := range msgs {
		out[i] = entry{shard: shard, id: m.ID, values: m.Values, redelivered: redelivered, readAt: now}
	}
	return out
}

// send hands entries to the batcher; it blocks while the batcher is busy,
// which is what stops reading while ClickHouse is down.
func (c *Consumer) send(hard context.Context, es []entry) bool {
	select {
	case c.in <- es:
		return true
	case <-hard.Done():
		return false
	}
}

// ensureGroup creates the group on key (and the stream, if missing).
func (c *Consumer) ensureGroup(ctx context.Context, key string) bool {
	err := c.rdb.XGroupCreateMkStream(ctx, key, c.opts.Group, c.opts.GroupStart).Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		if ctx.Err() == nil {
			c.log.Warn("click stream group create failed", "stream", key, "err", err)
		}
		return false
	}
	return true
}

// batch collects entries and flushes at BatchSize or BatchAge, until the
// readers are gone (final flush) or hard ends. Up to Flushers batches are
// flushed at once, each on its own goroutine, so the next batch's limiter
// and Redis round trips overlap the last one's ClickHouse insert; when all
// are busy the batcher waits, and so do the readers.
func (c *Consumer) batch(hard context.Context) {
	var pending []entry
	age := time.NewTimer(time.Hour)
	age.Stop()
	busy := make(chan struct{}, c.opts.Flushers)
	var flushing sync.WaitGroup
	defer flushing.Wait()
	flush := func() {
		age.Stop()
		if len(pending) == 0 {
			return
		}
		es := pending
		pending = nil
		select {
		case busy <- struct{}{}:
		case <-hard.Done():
			return
		}
		flushing.Go(func() {
			defer func() { <-busy }()
			c.flush(hard, es)
		})
	}
	for {
		select {
		case es, ok := <-c.in:
			if !ok {
				flush()
				return
			}
			if len(pending) == 0 {
				age.Reset(c.opts.BatchAge)
			}
			pending = append(pending, es...)
			if len(pending) >= c.opts.BatchSize {
				flush()
			}
		case <-age.C:
			flush()
		case <-hard.Done():
			return
		}
	}
}

// Ready fails when flushes have been failing for longer than UnhealthyAfter;
// the error carries the lag per shard (the server logs it).
func (c *Consumer) Ready(context.Context) error {
	c.mu.Lock()
	since, lastErr := c.failingSince, c.lastErr
	c.mu.Unlock()
	if since.IsZero() || time.Since(since) < c.opts.UnhealthyAfter {
		return nil
	}
	return fmt.Errorf("click consumer: flushes failing for %s, lag %s: %w",
		time.Since(since).Round(time.Second), c.lagSummary(), lastErr)
}

// Status is the consumer's state for the ops endpoint.
type Status struct {
	Consumer string     `json:"consumer"`
	Group    string     `json:"group"`
	Healthy  bool       `json:"healthy"`
	Failing  string     `json:"failing_for,omitempty"`
	Lag      []ShardLag `json:"lag"`
}

// Status returns the consumer's state and the last measured lag.
func (c *Consumer) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Status{Consumer: c.opts.Name, Group: c.opts.Group, Healthy: c.failingSince.IsZero(),
		Lag: append([]ShardLag(nil), c.lag...)}
	if !s.Healthy {
		s.Failing = time.Since(c.failingSince).Round(time.Millisecond).String()
	}
	return s
}

func (c *Consumer) failed(stage string, err error) {
	c.mu.Lock()
	first := c.failingSince.IsZero()
	if first {
		c.failingSince = time.Now()
	}
	c.lastErr = err
	c.mu.Unlock()
	c.m.failure(stage)
	c.log.Warn("click flush failed; retrying", "stage", stage, "err", err)
}

func (c *Consumer) succeeded() {
	c.mu.Lock()
	since := c.failingSince
	c.failingSince, c.lastErr = time.Time{}, nil
	c.mu.Unlock()
	if !since.IsZero() {
		c.log.Info("click flush recovered", "after", time.Since(since).Round(time.Millisecond))
	}
}

func (c *Consumer) failing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.failingSince.IsZero()
}

// backoff is exponential between RetryMin and RetryMax.
type backoff struct {
	min, max, cur time.Duration
}

func (c *Consumer) backoff() *backoff { return &backoff{min: c.opts.RetryMin, max: c.opts.RetryMax} }

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	return b.cur
}

func (b *backoff) reset() { b.cur = 0 }

// sleep waits d or until ctx ends; false means ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
