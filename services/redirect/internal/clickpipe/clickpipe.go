// Package clickpipe records click events without ever making a redirect
// wait: Record puts an event in a bounded in-process buffer (or drops and
// counts it when the buffer is full), and one writer per stream shard drains
// the buffer in batches, XADDing to its shard with MAXLEN ~ N. Close flushes
// what is buffered, bounded by its context.
package clickpipe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/redisconn"
)

// Config sizes the pipeline.
type Config struct {
	Streams clickevent.StreamConfig
	// Buffer is how many events may wait in memory.
	Buffer int
	// Batch is the most events one writer sends in one pipeline.
	Batch int
	// Linger is how long a writer waits to fill a batch.
	Linger time.Duration
	// WriteTimeout bounds one batch's round trip to Redis.
	WriteTimeout time.Duration
	// Route, if set, finds the master of a stream key (ClusterRoute): each
	// writer then sends its batches over a connection of its own
	// (shardConn), and rdb's pipeline carries only what that node
	// redirects. Without it, every batch is an rdb pipeline.
	Route Route
	// DialTimeout bounds a writer's connection attempt (default 1 s).
	DialTimeout time.Duration
	// NodeFailed, if set, is told each time a writer's connection to the
	// node Route named fails (refused, reset, hung up, timed out): that
	// node may be a master a failover replaced, whose slots Route's map
	// still gives it (ClusterReload reloads ClusterRoute's).
	NodeFailed func()
}

// Pipeline is the click recorder.
type Pipeline struct {
	cfg  Config
	rdb  redis.Cmdable
	log  *slog.Logger
	keys []string
	ch   chan clickevent.Event
	quit chan struct{}
	// abort cancels in-flight writes when Close's deadline passes.
	abortCtx context.Context
	abort    context.CancelFunc
	wg       sync.WaitGroup
	once     sync.Once

	dropped metric.Int64Counter
	written metric.Int64Counter
}

// New starts a pipeline writing to rdb.
func New(cfg Config, rdb redis.Cmdable, log *slog.Logger, meter metric.Meter) (*Pipeline, error) {
	p := &Pipeline{cfg: cfg, rdb: rdb, log: log, keys: clickevent.StreamKeys(cfg.Streams.Shards),
		ch: make(chan clickevent.Event, cfg.Buffer), quit: make(chan struct{})}
	p.abortCtx, p.abort = context.WithCancel(context.Background())
	var err1, err2 error
	p.dropped, err1 = meter.Int64Counter("kurz.redirect.click_events.dropped",
		metric.WithDescription("Click events lost: reason=buffer_full (the writers fall behind) or redis (XADD failed)"),
		metric.WithUnit("{event}"))
	p.written, err2 = meter.Int64Counter("kurz.redirect.click_events.written",
		metric.WithDescription("Click events appended to the click streams"), metric.WithUnit("{event}"))
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("click pipeline metrics: %w", err)
	}
	// Both drop series exist from the start, at 0: an alert on their rate
	// sees "no drops", not "no data".
	for _, reason := range []string{"buffer_full", "redis"} {
		p.dropped.Add(context.Background(), 0, metric.WithAttributes(attribute.String("reason", reason)))
	}
	if p.cfg.DialTimeout <= 0 {
		p.cfg.DialTimeout = time.Second
	}
	for _, key := range p.keys {
		p.wg.Go(func() { p.write(key) })
	}
	return p, nil
}

// Record queues e, or drops and counts it if the buffer is full. It never
// blocks.
func (p *Pipeline) Record(e clickevent.Event) {
	select {
	case p.ch <- e:
	default:
		p.dropped.Add(context.Background(), 1, metric.WithAttributes(attribute.String("reason", "buffer_full")))
	}
}

// Close stops the writers after they flushed the buffer, or when ctx ends
// (what is left is dropped and counted).
func (p *Pipeline) Close(ctx context.Context) error {
	p.once.Do(func() { close(p.quit) })
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		p.abort()
		<-done
		return fmt.Errorf("click pipeline: flush cut short: %w", ctx.Err())
	}
}

// write is one shard's writer.
func (p *Pipeline) write(key string) {
	batch := make([]clickevent.Event, 0, p.cfg.Batch)
	linger := time.NewTimer(p.cfg.Linger)
	defer linger.Stop()
	sc := &shardConn{dialTimeout: p.cfg.DialTimeout, failed: p.cfg.NodeFailed}
	defer sc.drop()
	var failing int // consecutive failed batches, to keep the log quiet
	flush := func() {
		if len(batch) == 0 {
			return
		}
		written, err := p.flush(sc, key, batch)
		p.written.Add(context.Background(), int64(written))
		if lost := len(batch) - written; lost > 0 {
			p.dropped.Add(context.Background(), int64(lost), metric.WithAttributes(attribute.String("reason", "redis")))
			if failing++; failing == 1 || failing%100 == 0 {
				p.log.Warn("click events dropped: stream write failed", "stream", key, "events", lost,
					"failed_batches_in_a_row", failing, "err", err)
			}
		} else {
			failing = 0
		}
		clear(batch) // the events' strings
		batch = batch[:0]
	}
	for {
		select {
		case e := <-p.ch:
			batch = append(batch, e)
			if len(batch) >= p.cfg.Batch {
				flush()
			}
		case <-linger.C:
			flush()
			linger.Reset(p.cfg.Linger)
		case <-p.quit:
			for {
				select {
				case e := <-p.ch:
					batch = append(batch, e)
					if len(batch) >= p.cfg.Batch {
						flush()
					}
					continue
				default:
				}
				break
			}
			flush()
			return
		}
	}
}

// flush appends batch to key, over sc when the pipeline routes, and
// returns how many events were written.
func (p *Pipeline) flush(sc *shardConn, key string, batch []clickevent.Event) (int, error) {
	ctx, cancel := context.WithTimeout(p.abortCtx, p.cfg.WriteTimeout)
	defer cancel()
	if p.cfg.Route == nil {
		return p.pipeline(ctx, key, batch)
	}
	node, err := p.cfg.Route(ctx, key)
	if err != nil {
		return p.pipeline(ctx, key, batch)
	}
	written, redo, err := sc.xadd(ctx, node, key, p.cfg.Streams.MaxLen, batch)
	if len(redo) > 0 {
		n, perr := p.pipeline(ctx, key, redo)
		written += n
		err = errors.Join(err, perr)
	}
	return written, err
}

// pipeline XADDs batch to key in rdb pipelines and returns how many were
// written. Events a node refused without running them (resp.NotServed:
// CLUSTERDOWN from a node that just left the cluster or whose view of the
// slot has not settled, TRYAGAIN, LOADING, a redirect past go-redis's
// MaxRedirects) are sent again, after the slot map's reload (NodeFailed)
// and a wait that doubles, while ctx allows: they ran nowhere, so they
// cannot be appended twice. Unsent, each was a click lost whenever a
// master was removed from a live cluster (redis-cli --cluster del-node).
func (p *Pipeline) pipeline(ctx context.Context, key string, batch []clickevent.Event) (int, error) {
	written := 0
	for wait := refusedFirstWait; ; wait = min(2*wait, refusedMaxWait) {
		n, refused, err := p.pipelineOnce(ctx, key, batch)
		written += n
		if len(refused) == 0 || !redisconn.Pause(ctx, wait) {
			return written, err
		}
		if p.cfg.NodeFailed != nil {
			p.cfg.NodeFailed()
		}
		batch = refused
	}
}

// The waits before events a node refused are sent again: the first and
// the longest.
const (
	refusedFirstWait = 10 * time.Millisecond
	refusedMaxWait   = 200 * time.Millisecond
)

// pipelineOnce XADDs batch to key in one rdb pipeline. It returns how many
// were written, the events refused unrun (redisconn.NotRun), and the first error.
func (p *Pipeline) pipelineOnce(ctx context.Context, key string, batch []clickevent.Event) (int, []clickevent.Event, error) {
	pipe := p.rdb.Pipeline()
	for _, e := range batch {
		pipe.XAdd(ctx, &redis.XAddArgs{
			Stream: key, MaxLen: p.cfg.Streams.MaxLen, Approx: true, ID: "*", Values: e.Args(),
		})
	}
	cmds, err := pipe.Exec(ctx)
	if err == nil {
		return len(batch), nil, nil
	}
	written := 0
	var refused []clickevent.Event
	for i, c := range cmds {
		switch cerr := c.Err(); {
		case cerr == nil:
			written++
		case redisconn.NotRun(cerr):
			refused = append(refused, batch[i])
		}
	}
	return written, refused, err
}
