package ratelimit

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

// Batches: CheckMany sends the requests of one call that go to the same
// Redis node as one script call (decide_batch.lua) per up to batchMax
// requests, instead of one EVALSHA each. Redis then pays one command, one
// script set-up and one TIME per batch, and the engine one goroutine, one
// deadline and one reply per batch instead of per request.

//go:embed decide_batch.lua
var decideBatchLua string

// batchSource decides a batch of independent requests whose keys live on
// one node. The flag lets it reach the undeclared keys of every slot the
// node serves: a cluster refuses declared keys of several slots, so the
// script declares the first key (which routes the call) and takes the
// others as arguments.
var batchSource = "#!lua flags=allow-cross-slot-keys\n" + stateLua + decideLua + decideBatchLua

var batchScript = redis.NewScript(batchSource)

// batchSHA is batchScript's digest, the EVALSHA argument.
var batchSHA = batchScript.Hash()

// batchMax bounds the requests of one script call, and so its run time on
// Redis, which serves nothing else meanwhile (~10 µs a request of one unit;
// a sliding log's request writes a member per unit, so those of more than
// one unit are not batched). batchMaxReply bounds its reply's integers.
const (
	batchMax      = 64
	batchMaxReply = 4096
)

// errBatchMoved is a batch its node did not run: a redirect, a stopped
// pipeline, a script that could not be loaded. Its requests are decided one
// by one.
var errBatchMoved = errors.New("ratelimit: batch not run on its node")

// aloneParallelism bounds the requests of one CheckMany decided one by one
// at once: enough to fill the nodes' pipelines.
const aloneParallelism = 64

// Request is one check of CheckMany.
type Request struct {
	Domain string
	Desc   map[string]string
	Cost   int64
}

// batched is a request of CheckMany on its way through a batch.
type batched struct {
	i       int
	domain  string
	rules   []Applied
	g       *group
	results []result
	reqID   string
	cost    int64
}

// replyLen is how many integers the batch script answers for b.
func (b *batched) replyLen() int { return 2 + 5*len(b.g.keys) }

// CheckMany decides independent requests, each exactly as Check decides
// it, and returns their responses in order.
//
// A request whose rules share one hash tag, none of them leased nor a
// sliding log of more than one unit, and that consumes (cost > 0), joins
// its node's batch: up to batchMax such requests run as one script call,
// one after another, each all or nothing as on its own. A request in a
// batch whose key the node no longer serves (its slot moved since the slot
// map was read) is marked by the script before it writes anything, and
// decided again on its own; so is every request of a batch the node does
// not run (batchOnRedis). Every other request (peeks, leased rules, rules
// over several hash tags) is decided as Check decides it. A batch that
// fails, is late or meets an open breaker leaves each of its requests to
// its rules' failure modes, as a single call would. Batches ride the node
// pipelines: without them (Options.AutoPipeline off) every request is
// decided as Check decides it.
func (e *Engine) CheckMany(ctx context.Context, reqs []Request) []*ratelimitv1.CheckQuotaResponse {
	out := make([]*ratelimitv1.CheckQuotaResponse, len(reqs))
	rs := e.rules.Load()
	now := time.Now()
	byNode := map[string][]*batched{}
	var alone []int
	for i, r := range reqs {
		_, rules := rs.Match(r.Domain, r.Desc)
		if len(rules) == 0 {
			out[i] = e.noRule(ctx, r.Domain)
			continue
		}
		if e.pipes == nil || r.Cost <= 0 || !batchable(rules, r.Cost) {
			alone = append(alone, i)
			continue
		}
		if resp, _ := e.cachedDenial(ctx, r.Domain, rules, r.Cost, now, nil); resp != nil {
			out[i] = resp
			continue
		}
		reqID := e.newReqID()
		groups := e.groups(rules, "", "check", reqID, r.Cost, nil)
		node := e.slots.node(groups[0].keys[0])
		if len(groups) != 1 || node == anyNode {
			alone = append(alone, i)
			continue
		}
		byNode[node] = append(byNode[node], &batched{
			i: i, domain: r.Domain, rules: rules, g: groups[0], results: make([]result, len(rules)), reqID: reqID, cost: r.Cost,
		})
	}

	var wg sync.WaitGroup
	var mu sync.Mutex // guards again
	var again []int
	for node, bs := range byNode {
		for len(bs) > 0 {
			n, reply := 0, 0
			for n < len(bs) && n < batchMax && reply+bs[n].replyLen() <= batchMaxReply {
				reply += bs[n].replyLen()
				n++
			}
			n = max(n, 1)
			chunk := bs[:n]
			bs = bs[n:]
			wg.Go(func() {
				moved := e.runBatch(ctx, node, chunk, now, out)
				if len(moved) > 0 {
					mu.Lock()
					again = append(again, moved...)
					mu.Unlock()
				}
			})
		}
	}
	e.decideAlone(ctx, reqs, alone, out)
	wg.Wait()
	e.decideAlone(ctx, reqs, again, out)
	return out
}

// batchable tells whether a request of rules at cost may join a batch: no
// rule decided from leases or in memory (unlimited), and no sliding log
// writing more than one member.
func batchable(rules []Applied, cost int64) bool {
	for _, a := range rules {
		if a.Rule.Unlimited {
			return false
		}
		if a.Rule.Lease.Size > 0 && !a.Rule.Shadow {
			return false
		}
		if a.Rule.Algorithm == ratelimitv1.Algorithm_ALGORITHM_SLIDING_LOG && a.units(cost) > 1 {
			return false
		}
	}
	return true
}

// decideAlone decides the requests reqs[i] for i in idx one by one, up to
// aloneParallelism at once, as Check does.
func (e *Engine) decideAlone(ctx context.Context, reqs []Request, idx []int, out []*ratelimitv1.CheckQuotaResponse) {
	if len(idx) == 0 {
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(aloneParallelism, len(idx)) {
		wg.Go(func() {
			for {
				pos := int(next.Add(1)) - 1
				if pos >= len(idx) {
					return
				}
				i := idx[pos]
				r := reqs[i]
				out[i] = e.Check(ctx, r.Domain, r.Desc, r.Cost)
			}
		})
	}
	wg.Wait()
}

// runBatch decides bs, requests whose keys node serves in the slot map, in
// one script call within the decision timeout and behind node's breaker,
// and writes their responses to out. It returns the indexes of the
// requests it did not decide: their keys were not on node.
func (e *Engine) runBatch(ctx context.Context, node string, bs []*batched, now time.Time, out []*ratelimitv1.CheckQuotaResponse) (moved []int) {
	keys := []string{bs[0].g.keys[0]}
	n := 1
	for _, b := range bs {
		n += 1 + len(b.g.keys) + len(b.g.args)
	}
	args := append(make([]any, 0, n), len(bs))
	want := 0
	for _, b := range bs {
		args = append(args, len(b.g.keys))
		for _, k := range b.g.keys {
			args = append(args, k)
		}
		args = append(args, b.g.args...)
		want += b.replyLen()
	}
	vals, err := e.onNode(ctx, node, func(ctx context.Context, node string) ([]int64, error) {
		vals, err := e.batchOnRedis(ctx, node, keys, args)
		if err == nil && len(vals) != want {
			err = scriptError(fmt.Sprintf("batch script: %d values for %d requests, want %d", len(vals), len(bs), want))
		}
		return vals, err
	})
	if errors.Is(err, errBatchMoved) && ctx.Err() == nil {
		// Not an outage: each request goes on its own.
		e.countBatch(ctx, 0, len(bs))
		for _, b := range bs {
			moved = append(moved, b.i)
		}
		return moved
	}
	off := 0
	for _, b := range bs {
		v := vals[min(off, len(vals)):min(off+b.replyLen(), len(vals))]
		off += b.replyLen()
		switch {
		case err != nil:
			b.g.err, b.g.abandoned = err, errors.Is(err, errAbandoned)
			if b.g.late = lateReplyOf(err); b.g.late != nil {
				b.g.lateAt = off - b.replyLen()
			}
			e.fallback(b.g, b.rules, b.results, b.cost, time.Now())
		case v[0] == -1:
			moved = append(moved, b.i)
			continue
		default:
			b.g.apply(v, b.rules, b.results)
		}
		out[b.i] = e.finish(ctx, "", b.domain, b.rules, b.results, []*group{b.g}, leased{}, b.reqID, b.cost, now)
	}
	if err == nil { // else every request went to its failure mode
		e.countBatch(ctx, len(bs)-len(moved), len(moved))
	}
	if len(moved) > 0 {
		e.slotsChanged()
	}
	return moved
}

// countBatch counts requests a batch decided and requests it sent back to
// be decided on their own.
func (e *Engine) countBatch(ctx context.Context, batched, rerouted int) {
	if batched > 0 {
		e.m.batchRequests.Add(ctx, int64(batched), e.m.batchedSet.Add...)
	}
	if rerouted > 0 {
		e.m.batchRequests.Add(ctx, int64(rerouted), e.m.reroutedSet.Add...)
	}
}

// batchOnRedis runs the batch script on node's pipeline, by its source
// (EVAL, which loads it there) if the node does not hold it. A batch is never sent
// through the cluster client: redirected by ASK during a slot's migration,
// it would run on the importing node with ASKING, which lets it read keys
// of that slot still on the source node as if they did not exist. What the
// pipeline cannot run comes back as errBatchMoved, and its requests go one
// by one: their scripts declare their keys, and Redis answers TRYAGAIN
// instead.
func (e *Engine) batchOnRedis(ctx context.Context, node string, keys []string, args []any) ([]int64, error) {
	vals, err := e.pipes.call(ctx, node, batchSHA, keys, args)
	if errors.Is(err, errNoScript) && ctx.Err() == nil {
		// EVAL on the same pipeline loads it on the node (pipes.eval).
		vals, err = e.pipes.eval(ctx, node, batchSource, keys, args)
	}
	switch {
	case err == nil || isScriptError(err) || ctx.Err() != nil:
		return vals, err
	case errors.Is(err, errRedirect), errors.Is(err, errPipeStopped), errors.Is(err, errNoScript):
		e.slotsChanged()
		return nil, fmt.Errorf("%w: %w", errBatchMoved, err)
	default:
		// The node failed (refused, reset, timed out).
		e.slotsChanged()
		return vals, err
	}
}
