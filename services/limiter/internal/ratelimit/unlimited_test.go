package ratelimit

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric/noop"
	"go.yaml.in/yaml/v3"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

const unlimitedRules = `
domains:
  edge:
    rules:
      - {name: per-user, key: [user], algorithm: fixed_window, limit: 10, window: 1h, failure_mode: open}
      - {name: vip, key: [user], match: {user: vip}, unlimited: true}
      - {name: per-path, key: [path], algorithm: fixed_window, limit: 10, window: 1h, failure_mode: closed}
`

// An unlimited rule takes a name, key and match; anything of a limit
// beside it is refused by name, as is a plan overriding it.
func TestCompileTakesAnUnlimitedRuleAndRefusesALimitBesideIt(t *testing.T) {
	rs := compile(t, unlimitedRules)
	if r := rs.Rules("edge")[1]; !r.Unlimited || r.Name != "vip" {
		t.Fatalf("rule vip: %+v, want unlimited", r)
	}
	var cfg Config
	if err := yaml.Unmarshal([]byte(`
domains:
  edge:
    rules:
      - {name: limited, key: [user], unlimited: true, algorithm: fixed_window, limit: 5, window: 1s}
      - {name: leased, key: [user], unlimited: true, lease: {size: 5, ttl: 1s}}
      - {name: shared, key: [path], match: {path: "/api/*"}, unlimited: true, share: true}
      - {name: failing, key: [user], unlimited: true, failure_mode: closed, shadow: true}
      - {name: starred, key: [path], match: {path: "/a*b"}, unlimited: true}
      - {name: fine, key: [user], match: {user: x}, unlimited: true}
plans:
  gold: {edge/fine: {limit: 100}}
`), &cfg); err != nil {
		t.Fatal(err)
	}
	_, err := Compile(cfg)
	if err == nil {
		t.Fatal("Compile: want an error")
	}
	for _, want := range []string{
		"rule edge/limited: unlimited: limits nothing and never reaches Redis, so algorithm, limit, window would mean nothing",
		"rule edge/leased: unlimited: limits nothing and never reaches Redis, so lease would mean nothing",
		"rule edge/shared: unlimited: limits nothing and never reaches Redis, so share would mean nothing",
		"rule edge/failing: unlimited: limits nothing and never reaches Redis, so failure_mode, shadow would mean nothing",
		`rule edge/starred: match path: "/a*b": '*' may only end a value`,
		"plan gold, rule edge/fine: the rule is unlimited: a plan has nothing of it to override",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

// An unlimited rule is matched as any rule: as specific as a value, it
// keeps the key's rule off that value through Envoy's API (and applies
// beside it through CheckQuota), with no state key built.
func TestMatchEnvoyUnlimitedValueBeatsItsKeysRuleAndBuildsNoKey(t *testing.T) {
	rs := compile(t, unlimitedRules)
	got := rs.MatchEnvoy("edge", map[string]string{"user": "vip"})
	if len(got) != 1 || got[0].Rule.Name != "vip" || got[0].Key != "" {
		t.Fatalf("MatchEnvoy user vip: %v (keys %+v), want vip alone, no key", names(got), got)
	}
	if got := names(rs.MatchEnvoy("edge", map[string]string{"user": "bob"})); len(got) != 1 || got[0] != "per-user" {
		t.Errorf("MatchEnvoy user bob: %v, want per-user", got)
	}
	if _, got := rs.Match("edge", map[string]string{"user": "vip"}); len(got) != 2 {
		t.Errorf("Match user vip: %v, want per-user and vip", names(got))
	}
}

// countingHook counts the commands a Redis client sends.
type countingHook struct{ n atomic.Int64 }

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		h.n.Add(1)
		return next(ctx, network, addr)
	}
}

func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// unreachableEngine is an engine of rules on a Redis that is not there,
// and the count of what it sent Redis (or dialled) since it was built.
func unreachableEngine(t testing.TB, rules string) (*Engine, *atomic.Int64) {
	t.Helper()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: 50 * time.Millisecond, ReadTimeout: 50 * time.Millisecond, WriteTimeout: 50 * time.Millisecond,
	})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &countingHook{}
	rdb.AddHook(hook)
	e, err := NewEngine(rdb, compile(t, rules), Options{Timeout: 50 * time.Millisecond}, slog.New(slog.DiscardHandler), noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Wait)
	hook.n.Store(0)
	return e, &hook.n
}

// An unlimited rule is decided in memory: allowed, its source UNLIMITED,
// nothing of a limit reported, and not one command sent to Redis (nor a
// failure mode standing in for one), however many requests.
func TestUnlimitedRuleDecidesInMemoryWithoutRedis(t *testing.T) {
	e, sent := unreachableEngine(t, unlimitedRules)
	ctx := context.Background()
	vip := map[string]string{"user": "vip"}
	for i := range 3 {
		resp, owners := e.CheckEach(ctx, "edge", []map[string]string{vip, vip}, []int64{1, 5})
		if !resp.Allowed || resp.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_UNLIMITED || resp.DecidingRule != "vip" {
			t.Fatalf("request %d: %+v, want allowed by vip, source UNLIMITED", i+1, resp)
		}
		if len(resp.Decisions) != 1 || len(owners) != 1 || len(owners[0]) != 2 {
			t.Fatalf("request %d: decisions %v, owners %v; want vip's once, for both descriptors", i+1, resp.Decisions, owners)
		}
		if d := resp.Decisions[0]; d.Limit != 0 || d.Remaining != 0 || d.Capacity != 0 || d.Algorithm != ratelimitv1.Algorithm_ALGORITHM_UNSPECIFIED {
			t.Errorf("request %d: decision %+v, want no limit", i+1, d)
		}
	}
	if n := sent.Load(); n != 0 {
		t.Errorf("Redis got %d commands or dials, want none", n)
	}
	// The same through CheckQuota's matching, where per-user applies too:
	// it goes to Redis (down: fail open) and decides.
	resp := e.Check(ctx, "edge", vip, 1)
	if resp.DecidingRule != "per-user" || resp.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_OPEN || len(resp.Decisions) != 2 ||
		resp.Decisions[1].Source != ratelimitv1.DecisionSource_DECISION_SOURCE_UNLIMITED {
		t.Errorf("Check user vip: %+v, want per-user deciding (failing open), vip unlimited beside it", resp)
	}
}

// A request whose only other rule is a shadow rule is told by the shadow
// rule, whatever the order of its descriptors: as envoyproxy/ratelimit
// takes its X-RateLimit headers from a descriptor with a current limit, a
// shadow one included, never from an unlimited one, which has none.
func TestAShadowRuleDecidesOverAnUnlimitedOneInEitherOrder(t *testing.T) {
	e, _ := unreachableEngine(t, `
domains:
  edge:
    rules:
      - {name: vip, key: [user], match: {user: vip}, unlimited: true}
      - {name: watched, key: [path], algorithm: fixed_window, limit: 10, window: 1h, failure_mode: open, shadow: true}
`)
	vip, path := map[string]string{"user": "vip"}, map[string]string{"path": "/x"}
	for _, descs := range [][]map[string]string{{vip, path}, {path, vip}} {
		resp, _ := e.CheckEach(context.Background(), "edge", descs, []int64{1, 1})
		if !resp.Allowed || resp.DecidingRule != "watched" || resp.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_SHADOW {
			t.Errorf("descriptors %v: allowed=%v deciding %q source %v, want allowed, told by the shadow rule watched", descs, resp.Allowed, resp.DecidingRule, resp.Source)
		}
	}
}
