package ratelimit

import (
	"context"
	"fmt"
	"strings"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

// Ad-hoc rules: a rule a caller sends with each request (gubernator's API
// carries the limit in every request) instead of one the Ruleset holds. The
// scripts take a rule's algorithm, limit, window, burst and cost as
// arguments, so such a rule is decided exactly as a stored one, with its
// own key.

// AdHocKey is the Redis key of an ad-hoc rule's state, without the engine's
// key prefix: "<namespace>:{<part>:<part>...}", each part escaped as a
// descriptor value is in a rule's key (percent-encoded outside
// [A-Za-z0-9._@/-], hashed past 64 bytes), so ':' never comes from a part
// and distinct parts make distinct keys (("a_b", "c") and ("a", "b_c") too).
// The whole key but the namespace is the hash tag. namespace must differ
// from "rl", which the stored rules' keys start with.
func AdHocKey(namespace string, parts ...string) string {
	var b strings.Builder
	b.WriteString(namespace)
	b.WriteString(":{")
	for i, p := range parts {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(escapeValue(p))
	}
	b.WriteByte('}')
	return b.String()
}

// CheckRule decides cost units (0 looks without consuming) of the ad-hoc
// rule r, whose state is at key (from AdHocKey; the engine's key prefix
// goes before it), as Check decides a stored rule: on Redis, by r's failure
// mode when Redis fails, through the over-limit cache, counted in
// kurz_ratelimit_decisions_total under r's domain and name (which the
// caller keeps to a fixed set: they are metric labels). r must be valid
// (Validate).
func (e *Engine) CheckRule(ctx context.Context, r *Rule, key string, cost int64) *ratelimitv1.CheckQuotaResponse {
	a := Applied{Rule: r, Key: e.opts.KeyPrefix + key, tag: hashTag(key)}
	resp, _ := e.decide(ctx, "", r.Domain, []Applied{a}, cost, nil)
	return resp
}

// ResetRule clears the state at an ad-hoc rule's key (from AdHocKey): its
// next decision starts full, as a new key does.
func (e *Engine) ResetRule(ctx context.Context, key string) error {
	full := e.opts.KeyPrefix + key
	// The cached denial first: it would otherwise deny the reset key
	// until its retry-after without asking Redis.
	e.denied.Remove(full)
	ctx, cancel := context.WithTimeout(ctx, e.opts.Timeout)
	defer cancel()
	if err := e.rdb.Del(ctx, full).Err(); err != nil {
		return fmt.Errorf("redis del: %w", err)
	}
	return nil
}

// hashTag is the part of key between its first '{' and the '}' after it,
// as Redis Cluster hashes it.
func hashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return key
	}
	return key[open+1 : open+1+end]
}

// ParseFailureMode reads a failure mode by its name in rules: open, closed
// or local.
func ParseFailureMode(s string) (ratelimitv1.FailureMode, error) {
	if m, ok := failureModes[s]; ok {
		return m, nil
	}
	return 0, fmt.Errorf("failure mode %q: want open, closed or local", s)
}

// SourceName is a decision source's name, as kurz_ratelimit_decisions_total
// labels it (redis, fail_open, over_limit_cache, ...).
func SourceName(s ratelimitv1.DecisionSource) string { return sourceName(s) }
