package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

var errBreakerOpen = errors.New("redis breaker open")

// errAbandoned wraps the error of a Redis call whose caller gave up first
// (onRedis): the failure mode answers no one, and nothing counts it.
var errAbandoned = errors.New("caller gave up")

// onRedis runs call, a script on the node that holds key, within the
// decision timeout and behind that node's breaker (onNode).
func (e *Engine) onRedis(ctx context.Context, key string, call func(ctx context.Context, node string) ([]int64, error)) ([]int64, error) {
	return e.onNode(ctx, e.slots.node(key), call)
}

// onNode runs call on node within the decision timeout and behind node's
// breaker: it fails at once while the breaker is open, and its outcome
// feeds the breaker and the Redis latency metric (redisOutcome).
func (e *Engine) onNode(ctx context.Context, node string, call func(ctx context.Context, node string) ([]int64, error)) ([]int64, error) {
	br := e.breakers.get(node)
	ok, probe := br.allow(time.Now())
	if !ok {
		return nil, errBreakerOpen
	}
	rctx, cancel := context.WithTimeout(ctx, e.opts.Timeout)
	start := time.Now()
	vals, err := call(rctx, node)
	cancel()
	return vals, e.redisOutcome(ctx, node, br, probe, start, err)
}

// redisOutcome accounts for a Redis call to node that started at start and
// ended with err (probe: the breaker's half-open probe): it feeds node's
// breaker and the Redis latency metric, unless the caller gave up (ctx
// done) or the call never ran on the node (errBatchMoved), and returns err,
// marked errAbandoned when the caller gave up.
func (e *Engine) redisOutcome(ctx context.Context, node string, br *breaker, probe bool, start time.Time, err error) error {
	if err != nil && ctx.Err() != nil {
		if probe {
			br.abandon()
		}
		// The caller gave up (its own deadline, or it went away): that says
		// nothing about Redis. Counted, a batch whose caller timed out
		// opened every node's breaker, and every caller got the failure
		// mode for a cooldown.
		return fmt.Errorf("%w: %w", errAbandoned, err)
	}
	if errors.Is(err, errBatchMoved) {
		// Not run there (a redirect, a stopped pipeline): not an outage.
		if probe {
			br.abandon()
		}
		return err
	}
	e.m.redisDuration.Record(ctx, time.Since(start).Seconds(), e.m.redisOutcome[err != nil].Record...)
	opened, closed := br.record(err == nil || isScriptError(err), probe, start, time.Now())
	if opened {
		e.log.WarnContext(ctx, "redis breaker opened; failure modes apply", "node", node, "cooldown", e.opts.BreakerCooldown, "err", err)
		e.m.breakerOpen.Add(ctx, 1)
	}
	if closed {
		e.log.InfoContext(ctx, "redis breaker closed; back on redis", "node", node)
		e.m.breakerOpen.Add(ctx, -1)
	}
	if err != nil && !errors.Is(err, errBreakerOpen) {
		e.log.DebugContext(ctx, "redis call failed", "node", node, "err", err)
	}
	return err
}

// luaScript is a script as the node pipelines send it: by digest
// (EVALSHA), and by source (EVAL) to a node that lost it; run is the
// cluster client's way to it.
type luaScript struct {
	run      *redis.Script
	sha, src string
}

var (
	decideLuaScript = luaScript{decideScript, decideScript.Hash(), decideSource}
	leaseLuaScript  = luaScript{leaseScript, leaseScript.Hash(), leaseSource}
)

// decideOnRedis runs the decision script on keys with args on node, the
// master of keys' slot in the slot map (onRedis found it), and returns its
// reply, or an error once ctx is done.
//
// Auto-pipelined, the script joins the next batch to its node (pipe.go)
// and the decision waits for its reply only until ctx's deadline: a batch
// runs on the pipeline's own I/O deadline, so the wait is what a deadline
// can cut. A script abandoned there is not withdrawn and may still run on
// Redis later: its error then carries its late reply (lateReply), and a
// denied request's giveBack returns what the reply says it consumed. One
// cut on the cluster client's path may run too, with no reply to read: a
// "check" then consumes units no caller was granted, which the window or
// bucket gives back in time.
func (e *Engine) decideOnRedis(ctx context.Context, node string, keys []string, args []any) ([]int64, error) {
	return e.scriptOnRedis(ctx, node, decideLuaScript, keys, args)
}

// scriptOnRedis runs s as decideOnRedis runs the decision script.
func (e *Engine) scriptOnRedis(ctx context.Context, node string, s luaScript, keys []string, args []any) ([]int64, error) {
	// Even a decision alone in flight takes its node's pipeline: at one
	// caller, 418-454 µs a call against 446-460 µs through the cluster
	// client, whose per-call work costs more than the hand-off to the
	// flusher.
	if e.pipes == nil || node == anyNode {
		return s.run.Run(ctx, e.rdb, keys, args...).Int64Slice()
	}
	vals, err := e.pipes.call(ctx, node, s.sha, keys, args)
	switch {
	case err == nil || isScriptError(err) || ctx.Err() != nil:
		return vals, err
	case errors.Is(err, errNoScript):
		// The node lost its script cache (restart, failover, SCRIPT
		// FLUSH): EVAL on the same pipeline loads it there (pipes.eval),
		// within the deadline.
		vals, err = e.pipes.eval(ctx, node, s.src, keys, args)
		if err == nil || isScriptError(err) || ctx.Err() != nil {
			return vals, err
		}
		e.slotsChanged()
		if errors.Is(err, errRedirect) || errors.Is(err, errPipeStopped) {
			return s.run.Run(ctx, e.rdb, keys, args...).Int64Slice()
		}
		return vals, err
	case errors.Is(err, errRedirect), errors.Is(err, errPipeStopped):
		// MOVED, ASK, TRYAGAIN, a node loading or demoted, or no longer a
		// master in the slot map just reloaded: the cluster client follows
		// redirects and resends what TRYAGAIN refused (its keys split by a
		// slot's migration), within the same deadline, and the slot map may
		// be out of date.
		e.slotsChanged()
		return s.run.Run(ctx, e.rdb, keys, args...).Int64Slice()
	default:
		// The node failed (refused, reset, timed out): if it was failed
		// over, the new master is in the slot map only once it is reloaded.
		e.slotsChanged()
		return vals, err
	}
}

// slotsChanged asks Run to reload the slot map now.
func (e *Engine) slotsChanged() {
	select {
	case e.slotsStale <- struct{}{}:
	default:
	}
}

// isScriptError tells a script's own error reply (a bug, not an outage) from
// a network failure or timeout: only the latter counts against the breaker.
func isScriptError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}
