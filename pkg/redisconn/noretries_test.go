package redisconn

import (
	"context"
	"errors"
	"testing"
	"time"

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

// errTryAgain is a node's answer to a command on keys split between two
// nodes by a slot's migration.
var errTryAgain = errors.New("TRYAGAIN Multiple keys request during rehashing of slot")

// A command refused with TRYAGAIN did not run: it is sent again until the
// slot's keys are together, and its reply is the one that ran.
func TestNoRetriesResendsACommandRefusedWithTryAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sends := 0
	single := sendOnce{}.ProcessHook(func(_ context.Context, cmd redis.Cmder) error {
		sends++
		if sends <= 3 {
			cmd.SetErr(errTryAgain)
			return errTryAgain
		}
		cmd.SetErr(nil)
		return nil
	})
	cmd := redis.NewCmd(ctx, "evalsha", "sha", 2, "{t}a", "{t}b")
	if err := single(ctx, cmd); err != nil {
		t.Fatalf("refused 3 times with TRYAGAIN, then run: %v", err)
	}
	if sends != 4 {
		t.Errorf("sent %d times, want 4 (3 TRYAGAIN, then run)", sends)
	}
}

// TRYAGAIN is retried only while ctx's deadline allows another attempt,
// and the caller sees TRYAGAIN, not a deadline that hides the cause.
func TestTryAgainIsRetriedOnlyUntilTheDeadline(t *testing.T) {
	deadline := time.Now().Add(50 * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	sends := 0
	single := sendOnce{}.ProcessHook(func(_ context.Context, cmd redis.Cmder) error {
		sends++
		return errTryAgain
	})
	err := single(ctx, redis.NewCmd(ctx, "evalsha", "sha", 2, "{t}a", "{t}b"))
	if !errors.Is(err, errTryAgain) {
		t.Errorf("error %v, want the node's TRYAGAIN", err)
	}
	if sends < 2 {
		t.Errorf("sent %d times within 50 ms, want retries", sends)
	}
	if over := time.Since(deadline); over > 25*time.Millisecond {
		t.Errorf("retried %s past the deadline", over)
	}
}

// A pipeline refused with TRYAGAIN is not resent: its other commands may
// have run.
func TestNoRetriesDoesNotResendAPipelineOnTryAgain(t *testing.T) {
	ctx := context.Background()
	sends := 0
	pipelined := sendOnce{}.ProcessPipelineHook(func(_ context.Context, cmds []redis.Cmder) error {
		sends++
		cmds[1].SetErr(errTryAgain)
		return errTryAgain
	})
	cmds := []redis.Cmder{redis.NewIntCmd(ctx, "incr", "{t}a"), redis.NewCmd(ctx, "evalsha", "sha", 2, "{t}a", "{t}b")}
	if err := pipelined(ctx, cmds); !errors.Is(err, errTryAgain) {
		t.Errorf("error %v, want TRYAGAIN", err)
	}
	if sends != 1 {
		t.Errorf("pipeline sent %d times, want once", sends)
	}
}
