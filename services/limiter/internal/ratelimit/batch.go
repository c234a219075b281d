package ratelimit

import (
	"context"
	_ "embed"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed decide_batch.lua
var decideBatchLua string

// batchSource decides a batch of requests in one script call. The flag
// lets it reach the undeclared keys of every slot the node serves.
var batchSource = "#!lua flags=allow-cross-slot-keys\n" + stateLua + decideLua + decideBatchLua

var batchScript = redis.NewScript(batchSource)

// Batching: the decisions waiting for the same Redis node go there as one
// script call (decide_batch.lua) instead of one call each. Redis then pays
// one command, one script set-up and one TIME per batch, and the engine one
// request and one reply. Each node has one worker: it takes what is queued
// (up to maxBatch), runs it, hands out the replies, and takes what queued
// meanwhile, so a batch grows with the load and a lone decision goes out
// at once.

// maxBatch bounds the requests of one batch (and so the script's run time
// on Redis, which serves nothing else meanwhile: ~10 µs a request).
const maxBatch = 64

// batchQueueSize bounds the decisions waiting for one node; past it a
// decision waits for room until its deadline, then its rules' failure
// modes decide.
const batchQueueSize = 1024

type batcher struct {
	rdb     *redis.ClusterClient
	timeout time.Duration
	// moved is called when a batch met a key its node no longer serves.
	moved func()
	// sized records the requests of each script call of a batch.
	sized func(n int)
	// batched counts the requests sent in batches of two or more;
	// rerouted, those sent again on their own after a batch met a key of
	// another node.
	batched, rerouted atomic.Int64

	mu     sync.Mutex
	queues map[string]chan *batchItem
	closed bool
	done   chan struct{}
	wg     sync.WaitGroup
}

// batchItem is one decision in a batch: a group's keys and arguments, and
// its reply.
type batchItem struct {
	ctx  context.Context
	keys []string
	args []any
	vals []int64
	err  error
	done chan struct{}
}

var errEngineClosed = errors.New("ratelimit: engine closed")

func newBatcher(rdb *redis.ClusterClient, timeout time.Duration, moved func(), sized func(n int)) *batcher {
	return &batcher{rdb: rdb, timeout: timeout, moved: moved, sized: sized, queues: map[string]chan *batchItem{}, done: make(chan struct{})}
}

// decide queues the decision for node's next batch and waits for its reply
// until ctx is done.
func (b *batcher) decide(ctx context.Context, node string, keys []string, args []any) ([]int64, error) {
	q, err := b.queue(node)
	if err != nil {
		return nil, err
	}
	it := &batchItem{ctx: ctx, keys: keys, args: args, done: make(chan struct{})}
	select {
	case q <- it:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case <-it.done:
		return it.vals, it.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (b *batcher) queue(node string) (chan *batchItem, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, errEngineClosed
	}
	q, ok := b.queues[node]
	if !ok {
		q = make(chan *batchItem, batchQueueSize)
		b.queues[node] = q
		b.wg.Go(func() { b.work(q) })
	}
	return q, nil
}

// close stops the workers; decisions still queued are answered with an
// error (their failure modes decide).
func (b *batcher) close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.done)
	}
	b.mu.Unlock()
	b.wg.Wait()
}

func (b *batcher) work(q chan *batchItem) {
	batch := make([]*batchItem, 0, maxBatch)
	for {
		select {
		case it := <-q:
			batch = append(batch, it)
		case <-b.done:
			for {
				select {
				case it := <-q:
					it.err = errEngineClosed
					close(it.done)
				default:
					return
				}
			}
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case it := <-q:
				batch = append(batch, it)
			default:
				break fill
			}
		}
		b.run(batch)
		clear(batch)
		batch = batch[:0]
	}
}

// run decides a batch and hands out the replies. Decisions whose callers
// have stopped waiting are left out: nothing is consumed for them.
func (b *batcher) run(batch []*batchItem) {
	live := batch[:0]
	for _, it := range batch {
		if err := it.ctx.Err(); err != nil {
			it.err = err
			close(it.done)
			continue
		}
		live = append(live, it)
	}
	if len(live) > 0 {
		b.sized(len(live))
	}
	switch len(live) {
	case 0:
		return
	case 1:
		b.runAlone(live[0])
		return
	}
	b.batched.Add(int64(len(live)))
	nargs := 1
	for _, it := range live {
		nargs += 1 + len(it.keys) + len(it.args)
	}
	args := make([]any, 0, nargs)
	args = append(args, len(live))
	for _, it := range live {
		args = append(args, len(it.keys))
		for _, k := range it.keys {
			args = append(args, k)
		}
		args = append(args, it.args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	vals, err := batchScript.Run(ctx, b.rdb, live[0].keys[:1], args...).Int64Slice()
	cancel()
	if err != nil && isRedirect(err) {
		// The first key's slot moved: every request goes on its own.
		b.moved()
		b.rerouted.Add(int64(len(live)))
		for _, it := range live {
			b.runAlone(it)
		}
		return
	}
	off := 0
	for _, it := range live {
		n := 2 + 5*len(it.keys)
		switch {
		case err != nil:
			it.err = err
		case off+n > len(vals):
			it.err = errors.New("ratelimit: short batch reply")
		case vals[off] == -1:
			// A key of another node (a slot moved): on its own, through
			// the client's redirects.
			b.moved()
			b.rerouted.Add(1)
			b.runAlone(it)
			off += n
			continue
		default:
			it.vals = vals[off : off+n : off+n]
		}
		off += n
		close(it.done)
	}
}

// runAlone decides one request with the single-request script, within its
// caller's deadline.
func (b *batcher) runAlone(it *batchItem) {
	it.vals, it.err = decideScript.Run(it.ctx, b.rdb, it.keys, it.args...).Int64Slice()
	close(it.done)
}

// isRedirect tells a reply that sends the call to another node (the slot
// moved, is moving, or the cluster is changing) from an outcome.
func isRedirect(err error) bool {
	for _, p := range []string{"MOVED", "ASK", "TRYAGAIN"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}
