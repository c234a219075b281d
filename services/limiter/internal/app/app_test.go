package app

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/testkit/servertest"
)

func load(t *testing.T, overrides map[string]string) Config {
	t.Helper()
	base := map[string]string{"KURZ_LIMITER_GRPC_ADDR": "127.0.0.1:0", "KURZ_LIMITER_HTTP_ADDR": "127.0.0.1:0"}
	for k, v := range overrides {
		base[k] = v
	}
	var cfg Config
	if err := config.LoadFrom(servertest.Env(base), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// A limiter started while Redis is unreachable (an outage, a rollout
// during one) serves, every decision by its rule's failure mode, instead
// of exiting: its peers fall back meanwhile, and a crash loop would leave
// the callers with no limiter at all.
func TestStartsWithoutRedisDecidingByFailureModes(t *testing.T) {
	rules, err := filepath.Abs(filepath.Join("testdata", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := load(t, map[string]string{"KURZ_REDIS_ADDRS": "127.0.0.1:1", "KURZ_REDIS_DIAL_TIMEOUT": "200ms",
		"KURZ_LIMITER_RULES_SOURCE": "file", "KURZ_LIMITER_RULES_FILE": rules})
	srv, err := New(context.Background(), cfg, servertest.Logger(t))
	if err != nil {
		t.Fatalf("New with Redis unreachable: %v, want a limiter that starts", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "kurz.ratelimit.v1.RateLimitService")
	client := ratelimitv1.NewRateLimitServiceClient(r.Conn)
	for _, c := range []struct {
		domain, key string
		allowed     bool
		source      ratelimitv1.DecisionSource
	}{
		{"race3", "user", true, ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_OPEN},
		{"quota", "api_key", false, ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED},
	} {
		resp, err := client.CheckQuota(context.Background(), &ratelimitv1.CheckQuotaRequest{Domain: c.domain, Descriptors: map[string]string{c.key: "k"}})
		if err != nil {
			t.Fatalf("%s: %v", c.domain, err)
		}
		if resp.GetAllowed() != c.allowed || resp.GetSource() != c.source {
			t.Errorf("%s: allowed=%v source %v, want %v by %v", c.domain, resp.GetAllowed(), resp.GetSource(), c.allowed, c.source)
		}
	}
}

// A misspelt Envoy header style stops the limiter at start, naming the
// variable, rather than falling back to a style nobody chose.
func TestUnknownEnvoyHeaderStyleRefused(t *testing.T) {
	cfg := load(t, map[string]string{"KURZ_LIMITER_ENVOY_HEADERS": "ietf"})
	_, err := New(context.Background(), cfg, servertest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "KURZ_LIMITER_ENVOY_HEADERS") {
		t.Fatalf("got %v, want an error naming KURZ_LIMITER_ENVOY_HEADERS", err)
	}
}

func TestBreakerSettingsAreChecked(t *testing.T) {
	for _, env := range []map[string]string{
		{"KURZ_LIMITER_BREAKER_COOLDOWN": "0s"},
		{"KURZ_LIMITER_BREAKER_COOLDOWN": "500ms", "KURZ_LIMITER_BREAKER_MAX_COOLDOWN": "200ms"},
	} {
		if err := load(t, env).validate(); err == nil || !strings.Contains(err.Error(), "KURZ_LIMITER_BREAKER_MAX_COOLDOWN") {
			t.Errorf("%v: got %v, want an error naming both cooldowns", env, err)
		}
	}
	// A cooldown alone, longer than the default longest (1s), stays valid
	// as it was before there was a longest: the engine takes it as both.
	for _, env := range []map[string]string{
		{"KURZ_LIMITER_BREAKER_COOLDOWN": "2s"},
		{"KURZ_LIMITER_BREAKER_COOLDOWN": "2s", "KURZ_LIMITER_BREAKER_MAX_COOLDOWN": "2s"},
	} {
		if err := load(t, env).validate(); err != nil {
			t.Errorf("%v: %v", env, err)
		}
	}
}

func TestFleetSettingsAreChecked(t *testing.T) {
	if err := load(t, nil).validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"KURZ_LIMITER_FLEET": "a{b}"}, "KURZ_LIMITER_FLEET"},
		{map[string]string{"KURZ_LIMITER_FLEET": strings.Repeat("x", 65)}, "KURZ_LIMITER_FLEET"},
		{map[string]string{"KURZ_LIMITER_REPLICAS": "3", "KURZ_LIMITER_MAX_REPLICAS": "2"}, "KURZ_LIMITER_MAX_REPLICAS"},
	} {
		err := load(t, c.env).validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an error naming %s", c.env, err, c.want)
		}
	}
	// The live count off, as before fleets.
	if err := load(t, map[string]string{"KURZ_LIMITER_FLEET_HEARTBEAT": "0s", "KURZ_LIMITER_REPLICAS": "3"}).validate(); err != nil {
		t.Errorf("heartbeat off: %v", err)
	}
}

// A key prefix that would move keys to other slots (a brace), or that a
// shell or a YAML file would mangle (whitespace), is refused by name; one
// without is taken.
func TestRedisKeyPrefixIsChecked(t *testing.T) {
	for _, bad := range []string{"{envoy}:", "envoy }", "two words", "tab\t", strings.Repeat("p", 65)} {
		err := load(t, map[string]string{"KURZ_LIMITER_REDIS_KEY_PREFIX": bad}).validate()
		if err == nil || !strings.Contains(err.Error(), "KURZ_LIMITER_REDIS_KEY_PREFIX") {
			t.Errorf("prefix %q: got %v, want an error naming KURZ_LIMITER_REDIS_KEY_PREFIX", bad, err)
		}
	}
	for _, ok := range []string{"", "envoy:", "staging/kurz."} {
		if err := load(t, map[string]string{"KURZ_LIMITER_REDIS_KEY_PREFIX": ok}).validate(); err != nil {
			t.Errorf("prefix %q: %v, want none", ok, err)
		}
	}
}

// A breaker threshold of 0 and a negative log sampling are refused by
// name, not replaced by a default without a word.
func TestThresholdAndLogSamplingAreChecked(t *testing.T) {
	for env, value := range map[string]string{"KURZ_LIMITER_BREAKER_THRESHOLD": "0", "KURZ_LIMITER_ALLOW_LOG_EVERY": "-1"} {
		if err := load(t, map[string]string{env: value}).validate(); err == nil || !strings.Contains(err.Error(), env) {
			t.Errorf("%s=%s: got %v, want an error naming it", env, value, err)
		}
	}
	if err := load(t, map[string]string{"KURZ_LIMITER_ALLOW_LOG_EVERY": "0"}).validate(); err != nil {
		t.Errorf("KURZ_LIMITER_ALLOW_LOG_EVERY=0 (none logged): %v", err)
	}
}

// The near-limit ratio is envoyproxy/ratelimit's NEAR_LIMIT_RATIO, 0.8
// unless set; a share of nothing, one past the whole capacity, or not a
// number is refused by name.
func TestNearLimitRatioIsChecked(t *testing.T) {
	if got := load(t, nil).NearLimitRatio; got != 0.8 {
		t.Errorf("default KURZ_LIMITER_NEAR_LIMIT_RATIO = %v, want 0.8", got)
	}
	for _, bad := range []string{"0", "-0.5", "1.01", "NaN", "+Inf"} {
		err := load(t, map[string]string{"KURZ_LIMITER_NEAR_LIMIT_RATIO": bad}).validate()
		if err == nil || !strings.Contains(err.Error(), "KURZ_LIMITER_NEAR_LIMIT_RATIO") {
			t.Errorf("KURZ_LIMITER_NEAR_LIMIT_RATIO=%s: got %v, want an error naming it", bad, err)
		}
	}
	for _, ok := range []string{"0.000001", "0.5", "1"} {
		if err := load(t, map[string]string{"KURZ_LIMITER_NEAR_LIMIT_RATIO": ok}).validate(); err != nil {
			t.Errorf("KURZ_LIMITER_NEAR_LIMIT_RATIO=%s: %v, want none", ok, err)
		}
	}
}

// The stores' settings are refused with the service's own, all named at
// once before anything starts (not one at a time as each store is built).
func TestStoreSettingsAreCheckedWithTheRest(t *testing.T) {
	err := load(t, map[string]string{"KURZ_REDIS_POOL_SIZE": "0", "KURZ_POSTGRES_MAX_CONNS": "0"}).Check()
	for _, name := range []string{"KURZ_REDIS_POOL_SIZE", "KURZ_POSTGRES_MAX_CONNS"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("Check: %v; want an error naming %s", err, name)
		}
	}
}

// A limiter reading its rules from a file never opens PostgreSQL: its
// settings are not checked.
func TestFileRulesIgnorePostgresSettings(t *testing.T) {
	if err := load(t, map[string]string{"KURZ_LIMITER_RULES_SOURCE": "file", "KURZ_POSTGRES_MAX_CONNS": "0"}).Check(); err != nil && strings.Contains(err.Error(), "KURZ_POSTGRES") {
		t.Errorf("file rules: %v; want no PostgreSQL setting refused", err)
	}
}

// A period near zero runs its loop as fast as its work completes (a reload
// of the rules, a heartbeat script on Redis); each has a floor, refused by
// name below it and accepted at it.
func TestPeriodsHaveAFloor(t *testing.T) {
	for name, floor := range map[string]time.Duration{
		"KURZ_LIMITER_RULES_REFRESH":   time.Second,
		"KURZ_LIMITER_FLEET_HEARTBEAT": 100 * time.Millisecond,
	} {
		for _, d := range []time.Duration{time.Nanosecond, floor - time.Millisecond} {
			if err := load(t, map[string]string{name: d.String()}).validate(); err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s=%s: %v, want an error naming it", name, d, err)
			}
		}
		if err := load(t, map[string]string{name: floor.String()}).validate(); err != nil {
			t.Errorf("%s=%s: %v, want accepted", name, floor, err)
		}
	}
}
