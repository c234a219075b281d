package redisconn

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
)

// A NoRetries client never retries on a node, and keeps the cluster
// client's redirects: with MaxRedirects -1 a command refused with MOVED or
// ASK while a slot moves fails instead of being sent where the slot went.
func TestNoRetriesFollowsRedirects(t *testing.T) {
	o := &options{cluster: &redis.ClusterOptions{}}
	NoRetries(o)
	if o.cluster.MaxRetries != -1 {
		t.Errorf("MaxRetries %d, want -1: a node client would retry", o.cluster.MaxRetries)
	}
	if o.cluster.MaxRedirects < 0 {
		t.Errorf("MaxRedirects %d: MOVED and ASK are not followed", o.cluster.MaxRedirects)
	}
	if len(o.hooks) != 1 {
		t.Fatalf("%d hooks, want the one that marks commands NoRetry", len(o.hooks))
	}
}

// The hook hands go-redis every command, single or pipelined, marked
// NoRetry, and each reply lands in the caller's command.
func TestNoRetriesMarksEveryCommand(t *testing.T) {
	ctx := context.Background()
	errReply := errors.New("reply")
	seen := 0
	single := sendOnce{}.ProcessHook(func(_ context.Context, cmd redis.Cmder) error {
		if !cmd.NoRetry() {
			t.Errorf("%v reached go-redis without NoRetry", cmd.Args())
		}
		seen++
		cmd.SetErr(errReply)
		return errReply
	})
	pipelined := sendOnce{}.ProcessPipelineHook(func(_ context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if !cmd.NoRetry() {
				t.Errorf("pipelined %v reached go-redis without NoRetry", cmd.Args())
			}
			seen++
			cmd.SetErr(errReply)
		}
		return errReply
	})
	incr := redis.NewIntCmd(ctx, "incr", "k")
	_ = single(ctx, incr)
	adds := []redis.Cmder{redis.NewStringCmd(ctx, "xadd", "s", "*", "f", "v"), redis.NewStringCmd(ctx, "xadd", "s", "*", "f", "w")}
	_ = pipelined(ctx, adds)
	if seen != 3 {
		t.Fatalf("go-redis saw %d commands, want 3", seen)
	}
	for _, cmd := range append(adds, incr) {
		if !errors.Is(cmd.Err(), errReply) {
			t.Errorf("%v: reply %v did not reach the caller's command", cmd.Args(), cmd.Err())
		}
	}
}
