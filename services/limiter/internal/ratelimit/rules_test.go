package ratelimit

import (
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestEscapeValueKeepsKeysApartAndTagsOurs(t *testing.T) {
	values := []string{"a", "a:b", "a%3Ab", "{a}", "a}", "{", "}", "a b", "%", "#", strings.Repeat("x", 64), strings.Repeat("x", 65), strings.Repeat("x", 66)}
	seen := map[string]string{}
	for _, v := range values {
		got := escapeValue(v)
		if strings.ContainsAny(got, "{}: ") {
			t.Errorf("escapeValue(%q) = %q: contains a brace, colon or space", v, got)
		}
		if other, dup := seen[got]; dup {
			t.Errorf("escapeValue(%q) = escapeValue(%q) = %q", v, other, got)
		}
		seen[got] = v
	}
	if got := escapeValue(strings.Repeat("y", 1000)); len(got) > maxValueLen {
		t.Errorf("long value escaped to %d bytes, want at most %d", len(got), maxValueLen)
	}
}

func TestStateKeysAndHashTags(t *testing.T) {
	r := &Rule{Domain: "api", Name: "per-key", Key: []string{"tenant", "api_key"}}
	desc := map[string]string{"tenant": "ac{me", "api_key": "k:{1}"}
	check := func(shard, prefix, wantKey, wantTag string) {
		t.Helper()
		key, tag := r.keyAndTag(desc, prefix)
		if key != wantKey || tag != wantTag {
			t.Errorf("%s, prefix %q: got key %q, tag %q; want %q, %q", shard, prefix, key, tag, wantKey, wantTag)
		}
		if got := r.stateKey(desc); prefix == "" && got != key {
			t.Errorf("%s: stateKey %q, keyAndTag %q", shard, got, key)
		}
		if got := keySlot(key); got != keySlot("{"+tag+"}") {
			t.Errorf("%s, prefix %q: key in slot %d, its tag in %d", shard, prefix, got, keySlot("{"+tag+"}"))
		}
	}
	check("own-key shard", "", "rl:{api:per-key:ac%7Bme:k%3A%7B1%7D}", "api:per-key:ac%7Bme:k%3A%7B1%7D")
	// A prefix goes before the braces: the tag, so the slot, is the same.
	check("own-key shard", "envoy:", "envoy:rl:{api:per-key:ac%7Bme:k%3A%7B1%7D}", "api:per-key:ac%7Bme:k%3A%7B1%7D")
	r.ShardByTenant = true
	check("tenant shard", "", "rl:{t:ac%7Bme}:api:per-key:ac%7Bme:k%3A%7B1%7D", "t:ac%7Bme")
	check("tenant shard", "staging/", "staging/rl:{t:ac%7Bme}:api:per-key:ac%7Bme:k%3A%7B1%7D", "t:ac%7Bme")
}

// Building a key with no prefix allocates the key alone, as before there
// was a prefix, and with one it still allocates only the key.
func TestStateKeyAllocatesOnlyTheKey(t *testing.T) {
	r := &Rule{Domain: "api", Name: "per-key", Key: []string{"tenant", "api_key"}}
	desc := map[string]string{"tenant": "acme", "api_key": "k1"}
	for _, prefix := range []string{"", "envoy:"} {
		if n := testing.AllocsPerRun(100, func() { r.keyAndTag(desc, prefix) }); n != 1 {
			t.Errorf("prefix %q: %v allocations per key, want 1", prefix, n)
		}
	}
	// A rule sharing a prefix's counter writes the prefix into the same
	// key, not a string of its own first.
	shared := &Rule{Domain: "edge", Name: "api", Key: []string{"path"}, Match: map[string]string{"path": "/api/*"}, Share: true}
	if n := testing.AllocsPerRun(100, func() { shared.keyAndTag(map[string]string{"path": "/api/v1"}, "") }); n != 1 {
		t.Errorf("a shared prefix: %v allocations per key, want 1", n)
	}
}

func TestValidKeyPrefix(t *testing.T) {
	for _, ok := range []string{"", "envoy:", "staging/kurz.", strings.Repeat("p", MaxKeyPrefixLen)} {
		if err := ValidKeyPrefix(ok); err != nil {
			t.Errorf("ValidKeyPrefix(%q): %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"{envoy}:", "a}", "a{", "two words:", "tab\t", "nl\n", "nul\x00", "del\x7f", "é:", strings.Repeat("p", MaxKeyPrefixLen+1)} {
		if err := ValidKeyPrefix(bad); err == nil {
			t.Errorf("ValidKeyPrefix(%q): nil, want an error", bad)
		}
	}
	if err := ValidKeyPrefix("{x}"); err == nil || !strings.Contains(err.Error(), "braces") {
		t.Errorf("ValidKeyPrefix of a brace: %v, want an error naming the braces", err)
	}
}

// The engine's prefix is on every key its rules build, plain and sharded by
// tenant, and the ruleset it was given keeps its own keys.
func TestRulesetKeyPrefixIsOnEveryKey(t *testing.T) {
	rs := compile(t, `
domains:
  api:
    rules:
      - {name: per-user, key: [user], algorithm: fixed_window, limit: 10, window: 1m, failure_mode: open}
      - {name: per-tenant, key: [tenant, user], shard: tenant, algorithm: fixed_window, limit: 10, window: 1m, failure_mode: open}
`)
	desc := map[string]string{"user": "u", "tenant": "acme"}
	_, plain := rs.Match("api", desc)
	_, prefixed := rs.withKeyPrefix("envoy:").Match("api", desc)
	if len(plain) != 2 || len(prefixed) != 2 {
		t.Fatalf("%d and %d rules applied, want 2 and 2", len(plain), len(prefixed))
	}
	for i := range plain {
		if want := "envoy:" + plain[i].Key; prefixed[i].Key != want || prefixed[i].tag != plain[i].tag {
			t.Errorf("rule %s: key %q, tag %q; want %q, tag %q", plain[i].Rule.Name, prefixed[i].Key, prefixed[i].tag, want, plain[i].tag)
		}
		if !strings.HasPrefix(plain[i].Key, "rl:{") {
			t.Errorf("rule %s without a prefix: key %q, want rl:{...}", plain[i].Rule.Name, plain[i].Key)
		}
	}
	if got := rs.withKeyPrefix(""); got != rs {
		t.Errorf("withKeyPrefix of the prefix it has copied the ruleset")
	}
}

func TestNewEngineRefusesABadKeyPrefix(t *testing.T) {
	_, err := NewEngine(nil, compile(t, "domains: {}\n"), Options{Timeout: time.Second, KeyPrefix: "{envoy}"}, quiet, nil)
	if err == nil || !strings.Contains(err.Error(), "key prefix") {
		t.Errorf("NewEngine with KeyPrefix {envoy}: %v, want an error naming the key prefix", err)
	}
}

func TestCompileReportsEveryProblem(t *testing.T) {
	var cfg Config
	if err := yaml.Unmarshal([]byte(`
domains:
  api:
    rules:
      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
      - {name: b, key: [ip], algorithm: magic, limit: 10, window: 1s, failure_mode: open}
      - {name: c, key: [ip], algorithm: fixed_window, limit: 0, window: 1s, failure_mode: open}
      - {name: d, key: [ip], algorithm: fixed_window, limit: 1, window: soon, failure_mode: open}
      - {name: e, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, failure_mode: maybe}
      - {name: f, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, failure_mode: open, shard: tenant}
      - {name: g, key: [ip], algorithm: fixed_window, limit: 9223372036854775807, window: 1s, failure_mode: open}
      - {name: h, key: [ip], algorithm: sliding_log, limit: 10001, window: 1s, failure_mode: open}
      - {name: i, key: [ip], algorithm: fixed_window, limit: 1, window: 9601h, failure_mode: open}
      - {name: j, key: [ip], algorithm: token_bucket, limit: 1, window: 8760h, burst: 1000000000, failure_mode: closed}
      - {name: k, key: [ip], algorithm: fixed_window, limit: 1, window: 1500us, failure_mode: open}
      - {name: l, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open, lease: {size: 1, ttl: 1500us}}
      - {name: m, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, failure_mode: open}
plans:
  free: {api/zzz: {limit: 1}}
  big: {api/a: {burst: 2000000000000}}
  odd: {api/m: {window: 2500us}}
tenants: {acme: gold}
`), &cfg); err != nil {
		t.Fatal(err)
	}
	_, err := Compile(cfg)
	if err == nil {
		t.Fatal("Compile: want an error")
	}
	for _, want := range []string{
		"api/a is defined twice", `algorithm "magic"`, "api/c: limit must be positive", `window "soon"`,
		`failure_mode "maybe"`, `shard: tenant needs "tenant"`, `plan free: no rule "api/zzz"`, `tenant acme: unknown plan "gold"`,
		"api/g: limit and burst must be at most 1099511627776", "api/h: limit 10001: a sliding log keeps one entry",
		"api/i: window 9601h0m0s: at most 9600h0m0s", "api/j: burst 1000000000 refills in",
		"plan big, rule api/a: limit and burst must be at most",
		// The scripts count in whole milliseconds: 1500us used to be cut to 1ms.
		"api/k: window 1.5ms: want a whole number of milliseconds", "api/l: lease: ttl 1.5ms: want a whole number of milliseconds",
		"plan odd, rule api/m: window 2.5ms: want a whole number of milliseconds",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

func TestMatchAppliesDefaultsAndPlans(t *testing.T) {
	rs := compile(t, `
domains:
  demo:
    defaults: {algo: token_bucket}
    rules:
      - {name: tb, key: [user], match: {algo: token_bucket}, algorithm: token_bucket, limit: 100, window: 60s, failure_mode: local}
      - {name: fw, key: [user], match: {algo: fixed_window}, algorithm: fixed_window, limit: 100, window: 60s, failure_mode: local}
  api:
    rules:
      - {name: per-key, key: [api_key], algorithm: token_bucket, limit: 600, window: 1m, burst: 100, failure_mode: open}
plans:
  free: {api/per-key: {limit: 60, burst: 20}}
tenants: {acme: free}
`)
	in := map[string]string{"user": "u"}
	filled, got := rs.Match("demo", in)
	if len(got) != 1 || got[0].Rule.Name != "tb" {
		t.Errorf("default algo: matched %v, want only tb", names(got))
	}
	if filled["algo"] != "token_bucket" || len(in) != 1 {
		t.Errorf("defaults: filled %v from %v, want algo filled in a copy", filled, in)
	}
	_, got = rs.Match("demo", map[string]string{"user": "u", "algo": "fixed_window"})
	if len(got) != 1 || got[0].Rule.Name != "fw" {
		t.Errorf("algo=fixed_window: matched %v, want only fw", names(got))
	}
	if _, got = rs.Match("demo", map[string]string{"algo": "fixed_window"}); len(got) != 0 {
		t.Errorf("without the key descriptor: matched %v, want none", names(got))
	}
	_, got = rs.Match("api", map[string]string{"api_key": "k", "tenant": "acme"})
	if len(got) != 1 || got[0].Plan != "free" || got[0].Rule.Limit != 60 || got[0].Rule.Burst != 20 || got[0].Rule.Window != time.Minute {
		t.Errorf("plan free: got %+v", got)
	}
	_, got = rs.Match("api", map[string]string{"api_key": "k", "tenant": "other"})
	if len(got) != 1 || got[0].Plan != "" || got[0].Rule.Limit != 600 {
		t.Errorf("no plan: got %+v", got)
	}
}

func names(as []Applied) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Rule.Name)
	}
	return out
}

func compile(t testing.TB, src string) *Ruleset {
	t.Helper()
	var cfg Config
	if err := yaml.Unmarshal([]byte(src), &cfg); err != nil {
		t.Fatal(err)
	}
	rs, err := Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestTenantPlansWithCopiesOnlyWhatChanges(t *testing.T) {
	base := NewTenantPlans(map[string]string{"a": "free", "b": "pro", "c": "", "d": "free"})
	if base.Len() != 3 || base.Plan("c") != "" || base.Plan("b") != "pro" {
		t.Fatalf("NewTenantPlans: len %d, c %q, b %q; want 3, \"\", pro", base.Len(), base.Plan("c"), base.Plan("b"))
	}
	next := base.With(map[string]string{"a": "pro", "b": "", "e": "free", "zz": ""})
	for tenant, want := range map[string]string{"a": "pro", "b": "", "d": "free", "e": "free", "zz": ""} {
		if got := next.Plan(tenant); got != want {
			t.Errorf("after With: plan of %s = %q, want %q", tenant, got, want)
		}
	}
	if next.Len() != 3 {
		t.Errorf("after With: %d tenants, want 3 (a, d, e)", next.Len())
	}
	for tenant, want := range map[string]string{"a": "free", "b": "pro", "d": "free", "e": ""} {
		if got := base.Plan(tenant); got != want {
			t.Errorf("With changed its receiver: plan of %s = %q, want %q", tenant, got, want)
		}
	}
	var none *TenantPlans
	if none.Plan("a") != "" || none.Len() != 0 || none.With(map[string]string{"a": "pro"}).Plan("a") != "pro" {
		t.Error("a nil TenantPlans is not an empty one")
	}
}

// Through Envoy's API a rule applies to a descriptor as a limit applies in
// envoyproxy/ratelimit: only to a descriptor whose entries are exactly its
// descriptors, and a value-specific rule replaces a generic one on the same
// descriptors; rules equally specific all apply.
func TestMatchEnvoyTakesTheLeafAndTheMostSpecificRules(t *testing.T) {
	rs := compile(t, `
domains:
  envoy:
    defaults: {tier: base}
    rules:
      - {name: api-global, key: [generic_key], match: {generic_key: api}, algorithm: fixed_window, limit: 6, window: 1m, failure_mode: open}
      - {name: api-per-ip, key: [generic_key, remote_address], match: {generic_key: api}, algorithm: fixed_window, limit: 3, window: 1m, failure_mode: open}
      - {name: per-user, key: [user], algorithm: fixed_window, limit: 5, window: 1m, failure_mode: open}
      - {name: per-user-hour, key: [user], algorithm: fixed_window, limit: 50, window: 1h, failure_mode: open}
      - {name: user-vip, key: [user], match: {user: vip}, algorithm: fixed_window, limit: 10, window: 1m, failure_mode: open}
      - {name: per-route-tier, key: [route], match: {tier: base}, algorithm: fixed_window, limit: 2, window: 1m, failure_mode: open}
      - {name: per-ip, key: [ip], algorithm: fixed_window, limit: 5, window: 1m, failure_mode: open}
      - {name: per-ip-base-hour, key: [ip], match: {tier: base}, algorithm: fixed_window, limit: 500, window: 1h, failure_mode: open}
`)
	for _, tc := range []struct {
		desc map[string]string
		want []string
	}{
		{map[string]string{"generic_key": "api"}, []string{"api-global"}},
		{map[string]string{"generic_key": "api", "remote_address": "10.0.0.1"}, []string{"api-per-ip"}},
		{map[string]string{"generic_key": "other"}, nil},
		{map[string]string{"user": "alice"}, []string{"per-user", "per-user-hour"}},
		{map[string]string{"user": "vip"}, []string{"user-vip"}},
		{map[string]string{"user": "alice", "path": "/p"}, nil},
		// The domain's default fills tier, as for CheckQuota.
		{map[string]string{"route": "r"}, []string{"per-route-tier"}},
		{map[string]string{"route": "r", "tier": "gold"}, nil},
		// A match on a default filled in makes no rule more specific.
		{map[string]string{"ip": "10.0.0.1"}, []string{"per-ip", "per-ip-base-hour"}},
		{map[string]string{"ip": "10.0.0.1", "tier": "base"}, []string{"per-ip-base-hour"}},
	} {
		if got := names(rs.MatchEnvoy("envoy", tc.desc)); !slices.Equal(got, tc.want) {
			t.Errorf("%v: rules %v, want %v", tc.desc, got, tc.want)
		}
		_, all := rs.Match("envoy", tc.desc)
		if len(all) < len(tc.want) {
			t.Errorf("%v: Match has %d rules, fewer than MatchEnvoy's", tc.desc, len(all))
		}
	}
}

// Envoy sends a header that is present but empty as an entry with value
// "": MatchEnvoy takes it as given, counted under "" (one key for every
// empty value, apart from any other value's), as envoyproxy/ratelimit
// does. It used to count as absent, and a client escaped every rule keyed
// on it by sending the header empty. CheckQuota keeps its own rule: an
// empty value is a descriptor left out, which a domain's default fills.
func TestAnEmptyEnvoyEntryIsGivenAndCountedUnderEmpty(t *testing.T) {
	rs := compile(t, `
domains:
  envoy:
    defaults: {tier: base}
    rules:
      - {name: per-user, key: [user], algorithm: fixed_window, limit: 5, window: 1m, failure_mode: open}
      - {name: per-route-tier, key: [route], match: {tier: base}, algorithm: fixed_window, limit: 2, window: 1m, failure_mode: open}
`)
	empty := rs.MatchEnvoy("envoy", map[string]string{"user": ""})
	if got := names(empty); !slices.Equal(got, []string{"per-user"}) {
		t.Fatalf("Envoy, user empty: rules %v, want [per-user]", got)
	}
	alice := rs.MatchEnvoy("envoy", map[string]string{"user": "alice"})
	if empty[0].Key == alice[0].Key {
		t.Errorf("an empty user shares alice's key %q", alice[0].Key)
	}
	// Given empty, tier is not the default's base: per-route-tier does
	// not apply (Envoy's entry route=r, tier="" names no such limit).
	if got := names(rs.MatchEnvoy("envoy", map[string]string{"route": "r", "tier": ""})); got != nil {
		t.Errorf("Envoy, tier empty: rules %v, want none", got)
	}
	if got := names(rs.MatchEnvoy("envoy", map[string]string{"route": ""})); !slices.Equal(got, []string{"per-route-tier"}) {
		t.Errorf("Envoy, route empty: rules %v, want [per-route-tier]", got)
	}

	if _, got := rs.Match("envoy", map[string]string{"user": ""}); got != nil {
		t.Errorf("CheckQuota, user empty: rules %v, want none (left out)", names(got))
	}
	if _, got := rs.Match("envoy", map[string]string{"route": "r", "tier": ""}); !slices.Equal(names(got), []string{"per-route-tier"}) {
		t.Errorf("CheckQuota, tier empty: rules %v, want [per-route-tier] (the default fills it)", names(got))
	}
}

// A match value ending in '*' is a prefix; a '*' anywhere else is refused
// by name, as is share without a prefix to share.
func TestCompileRefusesAStarOtherThanAtTheEndAndShareWithoutAPrefix(t *testing.T) {
	var cfg Config
	if err := yaml.Unmarshal([]byte(`
domains:
  api:
    rules:
      - {name: mid, key: [path], match: {path: "/api/*/links"}, algorithm: fixed_window, limit: 1, window: 1s, failure_mode: open}
      - {name: two, key: [path], match: {path: "/a*b*"}, algorithm: fixed_window, limit: 1, window: 1s, failure_mode: open}
      - {name: exact-share, key: [path], match: {path: "/api"}, share: true, algorithm: fixed_window, limit: 1, window: 1s, failure_mode: open}
      - {name: ok, key: [path], match: {path: "/api/*"}, share: true, algorithm: fixed_window, limit: 1, window: 1s, failure_mode: open}
`), &cfg); err != nil {
		t.Fatal(err)
	}
	_, err := Compile(cfg)
	if err == nil {
		t.Fatal("Compile: want an error")
	}
	for _, want := range []string{
		`api/mid: match path: "/api/*/links": '*' may only end a value`,
		`api/two: match path: "/a*b*": '*' may only end a value`,
		`api/exact-share: share: counts the values of a prefix together, and no match value ends in '*'`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "api/ok") {
		t.Errorf("a trailing '*' with share is refused: %v", err)
	}
}

// Through Envoy's API an exact value beats a prefix, a prefix the key
// alone, and the longer of two prefixes the shorter, as
// envoyproxy/ratelimit's walk decides for a file listing the longer first;
// through CheckQuota every rule whose prefix matches applies.
func TestMatchEnvoyPrefersExactThenPrefixThenKeyAndTheLongerPrefix(t *testing.T) {
	rs := compile(t, `
domains:
  envoy:
    rules:
      - {name: per-path, key: [path], algorithm: fixed_window, limit: 1, window: 1m, failure_mode: open}
      - {name: api, key: [path], match: {path: "/api/*"}, algorithm: fixed_window, limit: 2, window: 1m, failure_mode: open}
      - {name: api-v1, key: [path], match: {path: "/api/v1/*"}, algorithm: fixed_window, limit: 3, window: 1m, failure_mode: open}
      - {name: api-v1-links, key: [path], match: {path: "/api/v1/links"}, algorithm: fixed_window, limit: 4, window: 1m, failure_mode: open}
      - {name: any-agent, key: [agent], match: {agent: "*"}, algorithm: fixed_window, limit: 5, window: 1m, failure_mode: open}
`)
	for _, tc := range []struct {
		desc map[string]string
		want []string
	}{
		{map[string]string{"path": "/home"}, []string{"per-path"}},
		{map[string]string{"path": "/api/x"}, []string{"api"}},
		{map[string]string{"path": "/api/"}, []string{"api"}},
		{map[string]string{"path": "/api"}, []string{"per-path"}},
		{map[string]string{"path": "/api/v1/x"}, []string{"api-v1"}},
		{map[string]string{"path": "/api/v1/links"}, []string{"api-v1-links"}},
		{map[string]string{"path": "/api/v1/links/2"}, []string{"api-v1"}},
		// "*" takes every value, the empty one of an Envoy entry too.
		{map[string]string{"agent": "curl/8"}, []string{"any-agent"}},
		{map[string]string{"agent": ""}, []string{"any-agent"}},
		{map[string]string{"user": "u"}, nil},
	} {
		if got := names(rs.MatchEnvoy("envoy", tc.desc)); !slices.Equal(got, tc.want) {
			t.Errorf("MatchEnvoy %v: rules %v, want %v", tc.desc, got, tc.want)
		}
	}
	if _, got := rs.Match("envoy", map[string]string{"path": "/api/v1/links"}); !slices.Equal(names(got), []string{"per-path", "api", "api-v1", "api-v1-links"}) {
		t.Errorf("Match /api/v1/links: rules %v, want all four", names(got))
	}
	// CheckQuota leaves an empty value out: "*" does not take it.
	if _, got := rs.Match("envoy", map[string]string{"agent": ""}); got != nil {
		t.Errorf("Match agent empty: rules %v, want none", names(got))
	}
}

// A prefix rule counts each value apart (its key holds the value, a long
// one digested as any), unless it shares: then every value under the
// prefix has the one key, which no value's own key can be.
func TestAPrefixRuleKeysByValueUnlessItShares(t *testing.T) {
	rs := compile(t, `
domains:
  envoy:
    rules:
      - {name: api, key: [user, path], match: {path: "/api/*"}, algorithm: fixed_window, limit: 2, window: 1m, failure_mode: open}
      - {name: files, key: [user, path], match: {path: "/files/*"}, share: true, algorithm: fixed_window, limit: 2, window: 1m, failure_mode: open}
`)
	key := func(path string) string {
		t.Helper()
		got := rs.MatchEnvoy("envoy", map[string]string{"user": "u", "path": path})
		if len(got) != 1 {
			t.Fatalf("%s: rules %v, want one", path, names(got))
		}
		return got[0].Key
	}
	long := "/api/" + strings.Repeat("x", 80)
	for path, want := range map[string]string{
		"/api/a": "rl:{envoy:api:u:/api/a}", "/api/b": "rl:{envoy:api:u:/api/b}",
		long:           "rl:{envoy:api:u:" + escapeValue(long) + "}",
		"/files/a.pdf": "rl:{envoy:files:u:/files/*}", "/files/b.csv": "rl:{envoy:files:u:/files/*}",
		"/files/*": "rl:{envoy:files:u:/files/*}",
	} {
		if got := key(path); got != want {
			t.Errorf("%s: key %q, want %q", path, got, want)
		}
	}
	if !strings.HasPrefix(escapeValue(long), "#") {
		t.Errorf("a value over %d bytes is not digested: %q", maxValueLen, escapeValue(long))
	}
	// Shared or not, the other descriptors of the key keep their values.
	if a, b := rs.MatchEnvoy("envoy", map[string]string{"user": "a", "path": "/files/x"}), rs.MatchEnvoy("envoy", map[string]string{"user": "b", "path": "/files/x"}); a[0].Key == b[0].Key {
		t.Errorf("users a and b share key %q", a[0].Key)
	}
}

// A rule no request can reach is refused by name: a match or default on a
// descriptor name CheckQuota refuses, or an empty default (the descriptor
// left out). A fail-closed rule like that would protect nothing, and
// nothing would say so.
func TestCompileRefusesNamesNoRequestCanSend(t *testing.T) {
	var cfg Config
	if err := yaml.Unmarshal([]byte(`
domains:
  api:
    defaults: {"": x, "a b": y, tier: ""}
    rules:
      - {name: empty-match, key: [ip], match: {"": x}, algorithm: fixed_window, limit: 1, window: 1s, failure_mode: closed}
      - {name: spaced-match, key: [ip], match: {"a b{}:": x}, algorithm: fixed_window, limit: 1, window: 1s, failure_mode: closed}
      - {name: ok, key: [user, ip], match: {route: login}, algorithm: fixed_window, limit: 1, window: 1s, failure_mode: closed}
`), &cfg); err != nil {
		t.Fatal(err)
	}
	_, err := Compile(cfg)
	if err == nil {
		t.Fatal("Compile: want an error")
	}
	for _, want := range []string{
		`domain api: defaults: descriptor "": want letters`,
		`domain api: defaults: descriptor "a b": want letters`,
		`domain api: defaults: descriptor tier has an empty value`,
		`api/empty-match: match descriptor "": want letters`,
		`api/spaced-match: match descriptor "a b{}:": want letters`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "api/ok") {
		t.Errorf("a rule of valid names is refused: %v", err)
	}
}
