package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Baseline returns the decision script called directly with EVALSHA for one
// rule: the ceiling the engine wraps, for benchmarks. Each call decides one
// request of cost 1 with the key and arguments the engine sends for that
// rule alone (a request id of its own included, so sliding-log members stay
// distinct), and nothing the engine adds around the script: no rule
// matching, over-limit cache, deadline, breaker, fallback, auto-pipelining
// or response. It reports whether the request was allowed. desc must hold
// every descriptor of rule.Key. The function is safe for concurrent use.
func Baseline(rdb redis.Scripter, rule *Rule) func(ctx context.Context, desc map[string]string) (allowed bool, err error) {
	var pfx [6]byte
	_, _ = rand.Read(pfx[:])
	reqPfx := "bl" + hex.EncodeToString(pfx[:])
	var seq atomic.Uint64
	flags := 0 // as Engine.groups encodes them
	if rule.Queue {
		flags |= 1
	}
	if rule.Shadow {
		flags |= 2
	}
	// Boxed once; every call copies the interface values, not the numbers.
	ruleArgs := []any{int(rule.Algorithm), rule.Limit, rule.Window.Milliseconds(), rule.capacity(), int64(1), flags}
	return func(ctx context.Context, desc map[string]string) (bool, error) {
		args := make([]any, 3, 3+len(ruleArgs))
		args[0], args[1], args[2] = "", "check", reqPfx+strconv.FormatUint(seq.Add(1), 36)
		args = append(args, ruleArgs...)
		vals, err := decideScript.Run(ctx, rdb, []string{rule.stateKey(desc)}, args...).Int64Slice()
		if err != nil {
			return false, err
		}
		return vals[0] == 1, nil
	}
}
