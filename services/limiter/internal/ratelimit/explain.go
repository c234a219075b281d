package ratelimit

import (
	"context"
	"fmt"
	"strconv"
	"time"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

// Explain reports every rule that matches the request, what it would decide
// for cost now, the keys involved and their raw state; nothing is consumed.
func (e *Engine) Explain(ctx context.Context, domain string, desc map[string]string, cost int64) (*ratelimitv1.ExplainQuotaResponse, error) {
	_, rules := e.rules.Load().Match(domain, desc)
	out := &ratelimitv1.ExplainQuotaResponse{Allowed: true}
	if len(rules) == 0 {
		return out, nil
	}
	reqID := e.newReqID()
	groups := e.groups(rules, "", "peek", reqID, cost, nil)
	results := make([]result, len(rules))
	decideUnlimited(rules, results)
	for _, g := range groups {
		rctx, cancel := context.WithTimeout(ctx, 10*e.opts.Timeout)
		vals, err := decideScript.Run(rctx, e.rdb, g.keys, g.args...).Int64Slice()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("explain: redis: %w", err)
		}
		out.RedisTimeUnixMs = vals[1]
		for j, i := range g.idx {
			v := vals[2+5*j : 7+5*j]
			results[i] = result{
				allowed: v[0] == 1, limit: rules[i].Rule.Limit, remaining: v[1],
				resetAfter: time.Duration(v[2]) * time.Millisecond,
				delay:      time.Duration(v[4]) * time.Millisecond, source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS,
			}
			results[i].retryAfter, results[i].never = retryOf(v[3], rules[i].Rule)
			if rules[i].Rule.Shadow {
				results[i].source = ratelimitv1.DecisionSource_DECISION_SOURCE_SHADOW
			}
		}
	}
	resp := e.respond(domain, rules, results)
	out.Allowed = resp.Allowed
	for i, a := range rules {
		if a.Rule.Unlimited {
			// No key, no state: decided in memory.
			out.Rules = append(out.Rules, &ratelimitv1.RuleExplanation{Decision: resp.Decisions[i], KeyDescriptors: a.Rule.Key})
			continue
		}
		state, err := e.rawState(ctx, a)
		if err != nil {
			return nil, err
		}
		out.Rules = append(out.Rules, &ratelimitv1.RuleExplanation{
			Decision:       resp.Decisions[i],
			Keys:           []string{a.Key},
			KeyDescriptors: a.Rule.Key,
			FailureMode:    a.Rule.FailureMode,
			Shadow:         a.Rule.Shadow,
			Plan:           a.Plan,
			Burst:          a.Rule.capacity(),
			State:          state,
		})
	}
	return out, nil
}

func (e *Engine) rawState(ctx context.Context, a Applied) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*e.opts.Timeout)
	defer cancel()
	held, err := e.rdb.Type(ctx, a.Key).Result()
	if err != nil {
		return nil, fmt.Errorf("explain: redis: %w", err)
	}
	log := a.Rule.Algorithm == ratelimitv1.Algorithm_ALGORITHM_SLIDING_LOG
	state := map[string]string{}
	switch held {
	case "none":
	case "zset":
		if !log {
			// An earlier algorithm's state, read as none and replaced at
			// the next write (state.lua).
			state["stale_state"] = algorithmName(ratelimitv1.Algorithm_ALGORITHM_SLIDING_LOG)
			break
		}
		n, err := e.rdb.ZCard(ctx, a.Key).Result()
		if err != nil {
			return nil, fmt.Errorf("explain: redis: %w", err)
		}
		state["entries"] = strconv.FormatInt(n, 10)
	default:
		h, err := e.rdb.HGetAll(ctx, a.Key).Result()
		if err != nil {
			return nil, fmt.Errorf("explain: redis: %w", err)
		}
		tag, tagged := h["a"]
		if log || (tagged && tag != strconv.Itoa(int(a.Rule.Algorithm))) {
			n, _ := strconv.Atoi(tag)
			state["stale_state"] = algorithmName(ratelimitv1.Algorithm(n))
			break
		}
		delete(h, "a")
		state = h
	}
	ttl, err := e.rdb.PTTL(ctx, a.Key).Result()
	if err != nil {
		return nil, fmt.Errorf("explain: redis: %w", err)
	}
	if ttl > 0 {
		state["pttl_ms"] = strconv.FormatInt(ttl.Milliseconds(), 10)
	}
	return state, nil
}
