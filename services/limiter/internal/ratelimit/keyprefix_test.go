//go:build integration

package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric/noop"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

const prefixRules = `
domains:
  p:
    rules:
      - {name: per-user, key: [user], algorithm: fixed_window, limit: 2, window: 1h, failure_mode: closed}
      - {name: per-tenant, key: [tenant, user], match: {scope: tenant}, shard: tenant, algorithm: fixed_window, limit: 2, window: 1h, failure_mode: closed}
`

// plainKeys are the keys of the rules desc matches in domain, without a
// prefix: what a limiter without one writes.
func plainKeys(t *testing.T, rules, domain string, desc map[string]string) []string {
	t.Helper()
	_, applied := compile(t, rules).Match(domain, desc)
	if len(applied) == 0 {
		t.Fatalf("no rule of domain %s matches %v", domain, desc)
	}
	keys := make([]string, len(applied))
	for i, a := range applied {
		keys[i] = a.Key
	}
	return keys
}

// wantOnlyPrefixed checks that each key exists under prefix and not without
// it.
func wantOnlyPrefixed(t *testing.T, rdb *redis.ClusterClient, prefix string, keys []string) {
	t.Helper()
	ctx := context.Background()
	for _, k := range keys {
		if n, err := rdb.Exists(ctx, prefix+k).Result(); err != nil || n != 1 {
			t.Errorf("key %q: exists %d (err %v), want 1", prefix+k, n, err)
		}
		if n, err := rdb.Exists(ctx, k).Result(); err != nil || n != 0 {
			t.Errorf("key %q without the prefix: exists %d (err %v), want 0", k, n, err)
		}
	}
}

// Two limiters on one cluster with the same rule count apart under
// different prefixes, together under the same one; no prefix is a third
// counter, today's.
func TestEnginesOfDifferentKeyPrefixesCountApart(t *testing.T) {
	rdb := cluster(t)
	desc := map[string]string{"user": unique(t)}
	allowed := func(e *Engine) bool {
		return e.Check(context.Background(), "p", desc, 1).Allowed
	}
	a := engine(t, rdb, prefixRules, Options{KeyPrefix: "kp-a:"})
	if !allowed(a) || !allowed(a) || allowed(a) {
		t.Fatalf("prefix kp-a: want 2 of 3 allowed (limit 2)")
	}
	if sameAsA := engine(t, rdb, prefixRules, Options{KeyPrefix: "kp-a:"}); allowed(sameAsA) {
		t.Errorf("a second engine of prefix kp-a: allowed past the first's 2: the same prefix must share the counter")
	}
	b := engine(t, rdb, prefixRules, Options{KeyPrefix: "kp-b:"})
	if !allowed(b) || !allowed(b) || allowed(b) {
		t.Errorf("prefix kp-b: want 2 of 3 allowed, a counter of its own")
	}
	keys := plainKeys(t, prefixRules, "p", desc)
	wantOnlyPrefixed(t, rdb, "kp-a:", keys)
	wantOnlyPrefixed(t, rdb, "kp-b:", keys)
	if none := engine(t, rdb, prefixRules, Options{}); !allowed(none) {
		t.Errorf("no prefix: denied, want a counter of its own")
	}
	if n, err := rdb.Exists(context.Background(), keys[0]).Result(); err != nil || n != 1 {
		t.Errorf("key %q of the engine without a prefix: exists %d (err %v), want 1", keys[0], n, err)
	}
}

// Every family of keys the limiter writes carries its prefix: rules sharded
// by tenant, the batches of CheckMany, leases, ExplainQuota's reads and
// the fleet's heartbeats.
func TestKeyPrefixIsOnEveryKeyFamily(t *testing.T) {
	rdb := cluster(t)
	ctx := context.Background()
	const prefix = "kp-family:"

	t.Run("tenant shard", func(t *testing.T) {
		desc := map[string]string{"user": unique(t), "tenant": unique(t), "scope": "tenant"}
		e := engine(t, rdb, prefixRules, Options{KeyPrefix: prefix})
		if resp := e.Check(ctx, "p", desc, 1); resp.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
			t.Fatalf("source %v, want REDIS", resp.Source)
		}
		wantOnlyPrefixed(t, rdb, prefix, plainKeys(t, prefixRules, "p", desc))
	})

	t.Run("batch", func(t *testing.T) {
		e, batches := meteredEngine(t, rdb, prefixRules, Options{KeyPrefix: prefix, AutoPipeline: true})
		var reqs []Request
		var keys []string
		for range 4 {
			desc := map[string]string{"user": unique(t)}
			reqs = append(reqs, Request{Domain: "p", Desc: desc, Cost: 1})
			keys = append(keys, plainKeys(t, prefixRules, "p", desc)...)
		}
		for i, resp := range e.CheckMany(ctx, reqs) {
			if !resp.Allowed || resp.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
				t.Errorf("request %d: allowed %v, source %v; want allowed on REDIS", i, resp.Allowed, resp.Source)
			}
		}
		if batches("batched") == 0 {
			t.Fatalf("no request was decided in a batch: the test did not exercise batching")
		}
		wantOnlyPrefixed(t, rdb, prefix, keys)
	})

	t.Run("lease", func(t *testing.T) {
		desc := map[string]string{"user": unique(t), "algo": "fixed_window"}
		e := leaseEngine(t, rdb, leasedRules, Options{KeyPrefix: prefix})
		if resp := e.Check(ctx, "l", desc, 1); resp.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_LEASE {
			t.Fatalf("source %v, want LEASE", resp.Source)
		}
		keys := plainKeys(t, leasedRules, "l", desc)
		wantOnlyPrefixed(t, rdb, prefix, keys)
		if got := peekRemaining(t, e, "l", desc); got != 90 {
			t.Errorf("remaining on Redis with a lease of 10 out: %d, want 90", got)
		}
		if err := e.ReturnLeases(ctx); err != nil {
			t.Fatal(err)
		}
		if got := peekRemaining(t, e, "l", desc); got != 99 {
			t.Errorf("remaining on Redis after the lease went back: %d, want 99 (given back under the prefix)", got)
		}
		wantOnlyPrefixed(t, rdb, prefix, keys)
	})

	t.Run("explain", func(t *testing.T) {
		desc := map[string]string{"user": unique(t)}
		e := engine(t, rdb, prefixRules, Options{KeyPrefix: prefix})
		e.Check(ctx, "p", desc, 1)
		out, err := e.Explain(ctx, "p", desc, 0)
		if err != nil {
			t.Fatal(err)
		}
		want := prefix + plainKeys(t, prefixRules, "p", desc)[0]
		if len(out.Rules) != 1 || len(out.Rules[0].Keys) != 1 || out.Rules[0].Keys[0] != want {
			t.Fatalf("explained %v, want the one key %q", out.Rules, want)
		}
		if got := out.Rules[0].Decision.GetRemaining(); got != 1 {
			t.Errorf("explained remaining %d, want 1: the prefixed counter's", got)
		}
		if len(out.Rules[0].State) == 0 {
			t.Errorf("explained no state: the raw state was not read under the prefix")
		}
	})

	t.Run("fleet", func(t *testing.T) {
		name := "kp-" + time.Now().Format("150405.000000000")
		beat := func(prefix string) *Fleet {
			f, err := NewFleet(rdb, FleetOptions{Name: name, KeyPrefix: prefix, Heartbeat: time.Minute, MaxReplicas: 9}, quiet, noop.NewMeterProvider())
			if err != nil {
				t.Fatal(err)
			}
			f.beatOnce(ctx)
			t.Cleanup(func() { f.leave(ctx) })
			return f
		}
		a1, b := beat(prefix), beat("kp-other:")
		if a1.Size() != 1 || b.Size() != 1 {
			t.Errorf("one replica under each of two prefixes: sizes %d and %d, want 1 and 1", a1.Size(), b.Size())
		}
		if a2 := beat(prefix); a2.Size() != 2 {
			t.Errorf("a second replica under the same prefix: size %d, want 2", a2.Size())
		}
		if n, err := rdb.ZCard(ctx, FleetKey(prefix, name)).Result(); err != nil || n != 2 {
			t.Errorf("%s: %d replicas (err %v), want 2", FleetKey(prefix, name), n, err)
		}
		if n, err := rdb.Exists(ctx, FleetKey("", name)).Result(); err != nil || n != 0 {
			t.Errorf("%s: exists %d (err %v), want 0", FleetKey("", name), n, err)
		}
	})
}
