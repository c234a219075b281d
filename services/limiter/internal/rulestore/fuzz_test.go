package rulestore

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/services/limiter/internal/ratelimit"
)

// FuzzParse feeds arbitrary bytes to the rule file parser and the compiler
// after it. Neither may panic. A configuration that compiles must hold what
// the engine relies on: every rule of the file is there, valid (known
// algorithm and failure mode, positive limit, window of at least 1ms, burst
// not negative, at least one key descriptor, names of the safe charset, ID
// unique), every plan override names a rule and keeps those bounds once
// applied, every tenant's plan exists, and each state key holds exactly one
// hash tag. Writing a parsed configuration out again is stable: YAML (the
// file) and JSON (the rule tables' jsonb columns) both read back to a
// configuration that compiles to the same rules. The seed corpus is in
// testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Add(Bootstrap)
	for _, s := range []string{
		"",
		"domains: {}\n",
		"domains:\n  api:\n    rules:\n      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}\n",
		"domains:\n  api:\n    defaults: {tenant: anonymous}\n    rules:\n      - {name: t, key: [tenant], algorithm: leaky_bucket, limit: 5, window: 250ms, burst: 9, queue: true, shadow: true, shard: tenant, failure_mode: local, match: {route: x}}\nplans:\n  free: {api/t: {limit: 1, window: 1ms, burst: 1}}\ntenants: {acme: free}\n",
		"domains:\n  api:\n    rules:\n      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}\n---\ndomains: {x: [\n",
		"domains:\n  api:\n    rules:\n      - {name: a, key: [ip], algoritm: token_bucket, limit: 10, window: 1s, failure_mode: open}\n",
		"domains:\n  api:\n    rules:\n      - {name: a, key: [ip], algorithm: fixed_window, limit: -1, window: 0s, burst: -5, failure_mode: open}\n",
		"domains:\n  api:\n    rules:\n      - &r {name: a, key: [ip], algorithm: sliding_log, limit: 0x10, window: 1h, failure_mode: closed}\n      - *r\n",
		"domains:\n  a: {rules: [{name: b, key: [ip], algorithm: token_bucket, limit: 1, window: 1s, failure_mode: open}]}\n  a: {}\n",
		"plans: {free: {api/nope: {limit: 1}}}\ntenants: {acme: gold}\n",
		"domains:\n  \"a:{b}\":\n    rules:\n      - {name: \"x}\", key: [\"{ip}\"], algorithm: token_bucket, limit: 1, window: 1s, failure_mode: open}\n",
		"domains: {api: {rules: [{name: a, key: [ip], algorithm: token_bucket, limit: 9223372036854775807, window: 2562047h, failure_mode: open}]}}\n",
		"domains: {api: {rules: [{name: a, key: [ip], match: {k: \"\\x00\\xff\"}, algorithm: token_bucket, limit: 1, window: 1s, failure_mode: open}]}}\n",
		"a: &a [*a, *a]\n",
		"!!binary AAAA",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(checkParse)
}

// FuzzParseRule writes one rule, a plan override of it and a tenant on that
// plan as a well-formed rule file, every field fuzzed, so that the
// invariants of FuzzParse are checked on files that get past the YAML
// syntax: Parse must accept the file (unless it writes a plan figure of 0,
// which it refuses), and whatever compiles must be sound.
// The seed corpus is in testdata/fuzz/FuzzParseRule.
func FuzzParseRule(f *testing.F) {
	f.Add("api", "per-key", "api_key", "token_bucket", int64(600), "1m", int64(100), "open", "", "free", "", int64(60), int64(20))
	f.Add("api", "per-tenant", "tenant", "leaky_bucket", int64(1), "1ms", int64(0), "local", "tenant", "pro", "999us", int64(0), int64(-1))
	f.Add("a:{b}", "x}", "{ip}", "sliding_log", int64(-1), "0s", int64(-5), "closed", "key", "", "1h", int64(1), int64(1))
	f.Add("auth", "per-ip", "ip", "fixed_window", int64(9223372036854775807), "2562047h47m16.854775807s", int64(9223372036854775807), "closed", "", "gold", "-1s", int64(0), int64(0))
	f.Add("d", "n", "k", "sliding_window_counter", int64(10), "1.5s", int64(0), "open", "tenant", "p", "1e3s", int64(5), int64(0))
	f.Fuzz(func(t *testing.T, domain, name, key, algorithm string, limit int64, window string, burst int64, failureMode, shard, plan, planWindow string, planLimit, planBurst int64) {
		q := strconv.Quote
		// Fuzzed keys are explicit ("? key"): YAML caps an implicit key at
		// 1024 characters, and a longer one made this file ill-formed.
		data := fmt.Sprintf("domains:\n  ? %s\n  : rules:\n      - {name: %s, key: [%s], algorithm: %s, limit: %d, window: %s, burst: %d, failure_mode: %s, shard: %s}\n"+
			"plans:\n  ? %s\n  : {? %s : {limit: %d, window: %s, burst: %d}}\ntenants: {acme: %s}\n",
			q(domain), q(name), q(key), q(algorithm), limit, q(window), burst, q(failureMode), q(shard),
			q(plan), q(domain+"/"+name), planLimit, q(planWindow), planBurst, q(plan))
		_, err := Parse([]byte(data))
		if planLimit == 0 || planBurst == 0 {
			// A plan figure of 0 written out is refused (zeroFigure).
			if err == nil || !strings.Contains(err.Error(), "would keep the rule's own") {
				t.Fatalf("Parse of a plan figure of 0: %v; want it refused\n%s", err, data)
			}
			return
		}
		if err != nil {
			t.Fatalf("Parse refuses a well-formed rule file: %v\n%s", err, data)
		}
		checkParse(t, []byte(data))
	})
}

// checkParse parses data and checks what FuzzParse promises.
func checkParse(t *testing.T, data []byte) {
	cfg, err := Parse(data)
	if err != nil {
		if !strings.HasPrefix(err.Error(), "rules yaml: ") {
			t.Fatalf("Parse error %q lacks the rules yaml prefix", err)
		}
		return
	}
	rs, compileErr := ratelimit.Compile(cfg)

	// YAML out and back: the file format.
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatalf("yaml.Marshal of a parsed configuration: %v", err)
	}
	fromYAML, err := Parse(out)
	if err != nil {
		t.Fatalf("Parse of its own YAML output: %v\n%s", err, out)
	}
	if again, err := yaml.Marshal(fromYAML); err != nil || string(again) != string(out) {
		t.Fatalf("YAML round trip not stable: %v\n%s\n---\n%s", err, out, again)
	}
	// JSON out and back: the rule tables' jsonb columns.
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatalf("json.Marshal of a parsed configuration: %v", err)
	}
	var fromJSON ratelimit.Config
	if err := json.Unmarshal(js, &fromJSON); err != nil {
		t.Fatalf("json.Unmarshal of its own output: %v\n%s", err, js)
	}

	if compileErr != nil {
		for name, c := range map[string]ratelimit.Config{"YAML": fromYAML, "JSON": fromJSON} {
			if _, err := ratelimit.Compile(c); err == nil {
				t.Fatalf("a configuration that does not compile (%v) compiles after a %s round trip", compileErr, name)
			}
		}
		return
	}
	want := describe(t, cfg, rs)
	for name, c := range map[string]ratelimit.Config{"YAML": fromYAML, "JSON": fromJSON} {
		rs2, err := ratelimit.Compile(c)
		if err != nil {
			t.Fatalf("the configuration no longer compiles after a %s round trip: %v", name, err)
		}
		if got := describe(t, c, rs2); got != want {
			t.Fatalf("%s round trip changes the rules:\n%s\n---\n%s", name, want, got)
		}
	}
}

// describe checks the invariants of a compiled configuration and returns its
// rules, plans and tenants as text, for comparing two compilations.
func describe(t *testing.T, cfg ratelimit.Config, rs *ratelimit.Ruleset) string {
	t.Helper()
	var b strings.Builder
	ids := map[string]bool{}
	if got, want := rs.Domains(), slices.Sorted(maps.Keys(cfg.Domains)); !slices.Equal(got, want) {
		t.Fatalf("compiled domains %q, configured %q", got, want)
	}
	for _, domain := range rs.Domains() {
		rules := rs.Rules(domain)
		if len(rules) != len(cfg.Domains[domain].Rules) {
			t.Fatalf("domain %s: %d rules configured, %d compiled", domain, len(cfg.Domains[domain].Rules), len(rules))
		}
		fmt.Fprintf(&b, "domain %q defaults %v\n", domain, cfg.Domains[domain].Defaults)
		for _, r := range rules {
			checkRule(t, r)
			if r.Domain != domain || ids[r.ID()] {
				t.Fatalf("rule %s compiled into domain %s, or twice", r.ID(), domain)
			}
			ids[r.ID()] = true
			fmt.Fprintf(&b, "rule %+v\n", *r)
		}
	}
	for _, plan := range slices.Sorted(maps.Keys(cfg.Plans)) {
		for _, id := range slices.Sorted(maps.Keys(cfg.Plans[plan])) {
			if !ids[id] {
				t.Fatalf("plan %s overrides %q, which is no rule", plan, id)
			}
			fmt.Fprintf(&b, "plan %q %s %+v\n", plan, id, cfg.Plans[plan][id])
		}
	}
	for _, tenant := range slices.Sorted(maps.Keys(cfg.Tenants)) {
		plan := cfg.Tenants[tenant]
		if _, ok := cfg.Plans[plan]; !ok {
			t.Fatalf("tenant %q is on plan %q, which does not exist", tenant, plan)
		}
		fmt.Fprintf(&b, "tenant %q plan %q\n", tenant, plan)
		// Every rule as the tenant sees it, its plan applied.
		for _, domain := range rs.Domains() {
			for _, r := range rs.Rules(domain) {
				desc := map[string]string{"tenant": tenant}
				for _, k := range r.Key {
					if desc[k] == "" {
						desc[k] = "v:{" + k + "}"
					}
				}
				for k, v := range r.Match {
					desc[k] = v
				}
				_, applied := rs.Match(domain, desc)
				for _, a := range applied {
					checkRule(t, a.Rule)
					if strings.Count(a.Key, "{") != 1 || strings.Count(a.Key, "}") != 1 || !strings.HasPrefix(a.Key, "rl:{") {
						t.Fatalf("rule %s, tenant %q: state key %q does not hold exactly one hash tag", a.Rule.ID(), tenant, a.Key)
					}
				}
			}
		}
	}
	return b.String()
}

// checkRule fails t unless r is a rule the engine can run.
func checkRule(t *testing.T, r *ratelimit.Rule) {
	t.Helper()
	switch {
	case r.Validate() != nil:
		t.Fatalf("compiled rule %s does not validate: %v", r.ID(), r.Validate())
	case ratelimit.AlgorithmName(r.Algorithm) == "unspecified":
		t.Fatalf("rule %s: algorithm %v", r.ID(), r.Algorithm)
	case r.FailureMode == ratelimitv1.FailureMode_FAILURE_MODE_UNSPECIFIED:
		t.Fatalf("rule %s: no failure mode", r.ID())
	case r.Limit <= 0 || r.Window < time.Millisecond || r.Burst < 0 || len(r.Key) == 0:
		t.Fatalf("rule %s: limit %d, window %v, burst %d, key %q", r.ID(), r.Limit, r.Window, r.Burst, r.Key)
	}
}
