package rulestore

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"kurz.dev/pkg/envoydir"
	"kurz.dev/services/limiter/internal/ratelimit"
)

// fromEnvoy translates one file named edge.yaml.
func fromEnvoy(t *testing.T, yml string) (ratelimit.Config, error) {
	t.Helper()
	return FromEnvoy([]EnvoyFile{{Name: "edge.yaml", Data: []byte(yml)}})
}

func rule(name string, key []string, match map[string]string, limit int64, window string) ratelimit.RuleSpec {
	return ratelimit.RuleSpec{Name: name, Key: key, Match: match, Algorithm: "fixed_window", Limit: limit, Window: window, FailureMode: "open"}
}

func TestEnvoyConfigTranslatesEachLimitedPathToARule(t *testing.T) {
	shadow := rule("user_vip", []string{"user"}, map[string]string{"user": "vip"}, 1000, "1h")
	shadow.Shadow = true
	// Unlimited: a rule as specific as the descriptor, with nothing of a
	// limit, decided in memory (not a shadow rule counting on Redis).
	unlimited := ratelimit.RuleSpec{Name: "user_bob-smith-8708ac0e", Key: []string{"user"}, Match: map[string]string{"user": "bob smith"}, Unlimited: true}
	sharedFiles := rule("files_-.user-f19fca9f", []string{"files", "user"}, map[string]string{"files": "*"}, 5, "1h")
	sharedFiles.Share = true
	for _, tc := range []struct {
		name, yml string
		want      []ratelimit.RuleSpec
	}{{
		name: "nested limits at both levels (the README's example)",
		yml: `
domain: edge
descriptors:
  - key: generic_key
    value: api
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: remote_address
        rate_limit: {unit: second, requests_per_unit: 3, name: per-ip}
`,
		want: []ratelimit.RuleSpec{
			rule("generic_key_api", []string{"generic_key"}, map[string]string{"generic_key": "api"}, 100, "1m"),
			rule("per-ip", []string{"generic_key", "remote_address"}, map[string]string{"generic_key": "api"}, 3, "1s"),
		},
	}, {
		name: "a value's limit beside its key's, shadow mode, unlimited, metrics fields ignored",
		yml: `
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: user
    value: vip
    shadow_mode: true
    detailed_metric: true
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: user
    value: bob smith
    rate_limit: {unlimited: true}
`,
		want: []ratelimit.RuleSpec{rule("user", []string{"user"}, nil, 10, "1h"), shadow, unlimited},
	}, {
		name: "an unlimited descriptor no other rule would limit is no rule",
		yml: `
domain: edge
descriptors:
  - key: internal
    rate_limit: {unlimited: true}
  - key: tenant
    rate_limit: {unit: Day, requests_per_unit: 5}
`,
		want: []ratelimit.RuleSpec{rule("tenant", []string{"tenant"}, nil, 5, "24h")},
	}, {
		name: "every unit, whatever its case",
		yml: `
domain: edge
descriptors:
  - {key: a, rate_limit: {unit: SECOND, requests_per_unit: 1}}
  - {key: b, rate_limit: {unit: Minute, requests_per_unit: 2}}
  - {key: c, rate_limit: {unit: hour, requests_per_unit: 3}}
  - {key: d, rate_limit: {unit: day, requests_per_unit: 4}}
  - {key: e, rate_limit: {unit: week, requests_per_unit: 5}}
  - {key: f, rate_limit: {unit: month, requests_per_unit: 6}}
  - {key: g, rate_limit: {unit: year, requests_per_unit: 4294967295}}
`,
		want: []ratelimit.RuleSpec{
			rule("a", []string{"a"}, nil, 1, "1s"), rule("b", []string{"b"}, nil, 2, "1m"),
			rule("c", []string{"c"}, nil, 3, "1h"), rule("d", []string{"d"}, nil, 4, "24h"),
			rule("e", []string{"e"}, nil, 5, "168h"), rule("f", []string{"f"}, nil, 6, "720h"),
			rule("g", []string{"g"}, nil, 4294967295, "8760h"),
		},
	}, {
		// Wildcards as envoyproxy/ratelimit's README uses them: the
		// narrower listed first (it tries them in file order), an exact
		// value beside them, the key alone for the rest; share_threshold
		// on a wildcard whose limit is one level down.
		name: "wildcard values and share_threshold",
		yml: `
domain: edge
descriptors:
  - {key: path, value: "/api/v1/links", rate_limit: {unit: minute, requests_per_unit: 40}}
  - {key: path, value: "/api/v1/*", rate_limit: {unit: minute, requests_per_unit: 30}}
  - {key: path, value: "/api/*", rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: path, rate_limit: {unit: minute, requests_per_unit: 10}}
  - key: files
    value: "*"
    share_threshold: true
    descriptors: [{key: user, rate_limit: {unit: hour, requests_per_unit: 5}}]
`,
		want: []ratelimit.RuleSpec{
			rule("path_-api-v1-links-ea897375", []string{"path"}, map[string]string{"path": "/api/v1/links"}, 40, "1m"),
			rule("path_-api-v1---bf7921db", []string{"path"}, map[string]string{"path": "/api/v1/*"}, 30, "1m"),
			rule("path_-api---0cbffcc3", []string{"path"}, map[string]string{"path": "/api/*"}, 20, "1m"),
			rule("path", []string{"path"}, nil, 10, "1m"),
			sharedFiles,
		},
	}, {
		name: "a domain without limits",
		yml:  "domain: edge\n",
		want: []ratelimit.RuleSpec{},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := fromEnvoy(t, tc.yml)
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Domains["edge"].Rules; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("rules:\n got %+v\nwant %+v", got, tc.want)
			}
			if _, err := ratelimit.Compile(cfg); err != nil {
				t.Errorf("the translation does not compile: %v", err)
			}
		})
	}
}

// Names made of paths are unique, and stay within kurz's name rules
// whatever the values hold.
func TestEnvoyConfigDerivedNamesAreUniqueAndValid(t *testing.T) {
	cfg, err := fromEnvoy(t, `
domain: edge
descriptors:
  - {key: path, value: "GET /v1/links", rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: path, value: "GET:/v1/links", rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: path, value: "`+strings.Repeat("x", 80)+`", rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: path, value: "`+strings.Repeat("x", 81)+`", rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: other, rate_limit: {unit: second, requests_per_unit: 1, name: path_a}}
  - {key: path, value: a, rate_limit: {unit: second, requests_per_unit: 1}}
`)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range cfg.Domains["edge"].Rules {
		if !ratelimit.ValidName(r.Name) || seen[r.Name] {
			t.Errorf("rule name %q: invalid or taken twice", r.Name)
		}
		seen[r.Name] = true
	}
	if len(seen) != 6 {
		t.Errorf("%d names for 6 rules", len(seen))
	}
}

func TestEnvoyConfigRefusesWhatKurzCannotDecideAlike(t *testing.T) {
	for _, tc := range []struct{ name, yml, want string }{
		{"replaces", `
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10, name: a}
  - key: user
    value: vip
    rate_limit: {unit: hour, requests_per_unit: 100, replaces: [{name: a}]}
`, "envoy rules edge.yaml, domain edge, descriptor user=vip: replaces: kurz has no equivalent"},
		{"a star before a value's end", `
domain: edge
descriptors:
  - {key: path, value: "/api/*/links", rate_limit: {unit: hour, requests_per_unit: 10}}
`, "descriptor path=/api/*/links: value \"/api/*/links\": envoyproxy/ratelimit takes a '*' before the end as the character itself"},
		{"a key ending in a star", `
domain: edge
descriptors:
  - {key: "path*", rate_limit: {unit: hour, requests_per_unit: 10}}
`, "descriptor path*: key \"path*\" with no value: envoyproxy/ratelimit takes it as a wildcard"},
		{"share_threshold on an exact value", `
domain: edge
descriptors:
  - {key: path, value: api, share_threshold: true, rate_limit: {unit: hour, requests_per_unit: 10}}
`, "descriptor path=api: share_threshold on value \"api\": only a wildcard value (ending in '*') shares"},
		{"a shared wildcard and an unshared one on one path", `
domain: edge
descriptors:
  - key: user
    value: "team-*"
    share_threshold: true
    descriptors: [{key: path, value: "/api/*", rate_limit: {unit: hour, requests_per_unit: 10}}]
`, "descriptor user=team-* > path=/api/*: wildcards user=team-* (share_threshold) and user=team-* > path=/api/* (not) on one path"},
		// Envoy matches key_value against a wildcard's key_prefix: user_*
		// takes the entry user_agent=curl; the spelling check refuses it.
		{"a wildcard spelling another key of its level", `
domain: edge
descriptors:
  - {key: user, value: "*", rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: user_agent, rate_limit: {unit: hour, requests_per_unit: 5}}
`, "descriptor user_agent: envoyproxy/ratelimit finds this descriptor for a request entry user=agent too"},
		// Envoy tries wildcards in file order: /api/* takes /api/v1/x
		// before /api/v1/* is tried; kurz takes the longer prefix.
		{"a broader wildcard listed before a narrower one", `
domain: edge
descriptors:
  - {key: path, value: "/api/*", rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: path, value: "/api/v1/*", rate_limit: {unit: hour, requests_per_unit: 5}}
`, "for a request descriptor (path=/api/v1/<any other value>) envoyproxy/ratelimit applies only path=/api/* "},
		// Envoy takes a=x's exact branch before a's wildcard, and finds no
		// b there; kurz's wildcard rule would limit it.
		{"no going back from a value's branch to a wildcard's", `
domain: edge
descriptors:
  - key: a
    value: x
    descriptors: [{key: c, rate_limit: {unit: hour, requests_per_unit: 1}}]
  - key: a
    value: "*"
    descriptors: [{key: b, rate_limit: {unit: hour, requests_per_unit: 2}}]
`, "for a request descriptor (a=x, b=<any other value>) envoyproxy/ratelimit applies no limit"},
		// Envoy takes a=x* first, where b=y has no limit of its own but b
		// has; kurz's a > b=y has one exact value to a=x* > b's prefix.
		{"an exact value below a wildcard's key", `
domain: edge
descriptors:
  - key: a
    value: "x*"
    descriptors: [{key: b, rate_limit: {unit: hour, requests_per_unit: 1}}]
  - key: a
    descriptors: [{key: b, value: y, rate_limit: {unit: hour, requests_per_unit: 2}}]
`, "for a request descriptor (a=x<any other value>, b=y) envoyproxy/ratelimit applies only a=x* > b"},
		{"unknown field", `
domain: edge
descriptors:
  - {key: path, rate_limit: {unit: hour, requests_per_unt: 10}}
`, "envoy rules edge.yaml: yaml: unmarshal errors:\n  line 4: field requests_per_unt not found"},
		{"duplicate composite key", `
domain: edge
descriptors:
  - {key: user, value: vip, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: user, value: vip, rate_limit: {unit: hour, requests_per_unit: 20}}
`, "descriptor user=vip: duplicate descriptor composite key \"user_vip\""},
		{"a key spelt as another key and a value", `
domain: edge
descriptors:
  - {key: user, rate_limit: {unit: hour, requests_per_unit: 3}}
  - {key: user_vip, rate_limit: {unit: hour, requests_per_unit: 1}}
`, "descriptor user_vip: envoyproxy/ratelimit finds this descriptor for a request entry user=vip too"},
		{"a key and value spelt as another key and value, nested", `
domain: edge
descriptors:
  - key: api
    descriptors:
      - {key: plan, value: free, rate_limit: {unit: hour, requests_per_unit: 3}}
      - {key: plan_free, value: trial, rate_limit: {unit: hour, requests_per_unit: 1}}
`, "descriptor api > plan_free=trial: envoyproxy/ratelimit finds this descriptor for a request entry plan=free_trial too"},
		{"a float value", `
domain: edge
descriptors:
  - {key: version, value: 1.0, rate_limit: {unit: hour, requests_per_unit: 1}}
`, "envoy rules edge.yaml: line 4: value: 1.0 is a float64 to envoyproxy/ratelimit, which refuses the whole file for it"},
		{"a value over 2^63", `
domain: edge
descriptors:
  - {key: id, value: 18446744073709551615, rate_limit: {unit: hour, requests_per_unit: 1}}
`, "value: 18446744073709551615 is a uint64 to envoyproxy/ratelimit"},
		{"invalid unit", `
domain: edge
descriptors:
  - {key: user, rate_limit: {unit: fortnight, requests_per_unit: 10}}
`, "descriptor user: invalid rate limit unit \"fortnight\""},
		{"unit with unlimited", `
domain: edge
descriptors:
  - {key: user, rate_limit: {unit: hour, unlimited: true}}
`, "descriptor user: unit \"hour\" with unlimited"},
		{"requests_per_unit 0", `
domain: edge
descriptors:
  - {key: user, rate_limit: {unit: hour, requests_per_unit: 0}}
`, "descriptor user: requests_per_unit 0 denies every request"},
		{"no domain", `
descriptors:
  - {key: user, rate_limit: {unit: hour, requests_per_unit: 1}}
`, "envoy rules edge.yaml: no domain"},
		{"domain kurz cannot name", "domain: \"edge/v1\"\n", "domain \"edge/v1\": kurz domains are"},
		{"key kurz cannot name", `
domain: edge
descriptors:
  - {key: "x:y", rate_limit: {unit: hour, requests_per_unit: 1}}
`, "descriptor x:y: key \"x:y\": kurz descriptor keys are"},
		{"rule name kurz cannot take", `
domain: edge
descriptors:
  - {key: user, rate_limit: {unit: hour, requests_per_unit: 1, name: "per user"}}
`, "descriptor user: name \"per user\": kurz rule names are"},
		{"rule name twice", `
domain: edge
descriptors:
  - {key: user, rate_limit: {unit: hour, requests_per_unit: 1, name: n}}
  - {key: ip, rate_limit: {unit: hour, requests_per_unit: 1, name: n}}
`, "descriptor ip: name \"n\" is also descriptor user's"},
		{"a second document", "domain: edge\n---\ndomain: other\n", "more than one document"},
		{"a key twice on a path", `
domain: edge
descriptors:
  - key: user
    descriptors:
      - {key: user, rate_limit: {unit: hour, requests_per_unit: 1}}
`, "descriptor user > user: key user twice on one path"},
		{"the same keys in another order", `
domain: edge
descriptors:
  - key: a
    descriptors: [{key: b, rate_limit: {unit: hour, requests_per_unit: 1}}]
  - key: b
    descriptors: [{key: a, rate_limit: {unit: hour, requests_per_unit: 2}}]
`, "descriptor b > a: has the keys of descriptor a > b in another order"},
		{"deeper than a request descriptor goes", "domain: edge\ndescriptors:\n" + deep(33), "over 32 levels deep"},
		// Envoy takes a=x's branch and finds no b there: no limit. kurz's
		// rule on a and b alone would limit it.
		{"no going back from a value's branch", `
domain: edge
descriptors:
  - key: a
    value: x
    descriptors: [{key: b, value: y, rate_limit: {unit: hour, requests_per_unit: 1}}]
  - key: a
    descriptors: [{key: b, rate_limit: {unit: hour, requests_per_unit: 2}}]
`, "for a request descriptor (a=x, b=<any other value>) envoyproxy/ratelimit applies no limit (it takes a value's branch, else the first wildcard's it matches, before its key's and never goes back), but kurz would apply a > b"},
		{"a value's branch of other keys hides the key's", `
domain: edge
descriptors:
  - key: a
    value: x
    descriptors: [{key: c, rate_limit: {unit: hour, requests_per_unit: 1}}]
  - key: a
    descriptors: [{key: b, rate_limit: {unit: hour, requests_per_unit: 2}}]
`, "for a request descriptor (a=x, b=<any other value>) envoyproxy/ratelimit applies no limit"},
		// Envoy: a=x's branch first, so only the first applies; kurz: one
		// value each, both would.
		{"values at different levels", `
domain: edge
descriptors:
  - key: a
    value: x
    descriptors: [{key: b, rate_limit: {unit: hour, requests_per_unit: 1}}]
  - key: a
    descriptors: [{key: b, value: y, rate_limit: {unit: hour, requests_per_unit: 2}}]
`, "for a request descriptor (a=x, b=y) envoyproxy/ratelimit applies only a=x > b (it takes a value's branch, else the first wildcard's it matches, before its key's and never goes back), but kurz would apply a=x > b and a > b=y"},
		{"an unlimited value its key's limit would reach", `
domain: edge
descriptors:
  - key: a
    value: x
    descriptors: [{key: b, rate_limit: {unlimited: true}}]
  - key: a
    descriptors: [{key: b, value: y, rate_limit: {unit: hour, requests_per_unit: 2}}]
`, "envoyproxy/ratelimit applies only a=x > b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := fromEnvoy(t, tc.yml)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got error %v\nwant one containing %q", err, tc.want)
			}
		})
	}
}

// What envoyproxy/ratelimit reads as text kurz matches as that text: a
// quoted float, an int, an int with underscores or in binary (YAML 1.1
// types, which it reads the file with, and which it takes).
func TestEnvoyConfigMatchesScalarValuesAsTheirText(t *testing.T) {
	cfg, err := fromEnvoy(t, `
domain: edge
descriptors:
  - {key: a, value: "1.0", rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: b, value: 9223372036854775807, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: c, value: 1_000, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: d, value: 0b101, rate_limit: {unit: hour, requests_per_unit: 1}}
`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a": "1.0", "b": "9223372036854775807", "c": "1_000", "d": "0b101"}
	for _, r := range cfg.Domains["edge"].Rules {
		if k := r.Key[0]; r.Match[k] != want[k] {
			t.Errorf("rule %s matches %q, want %q", r.Name, r.Match[k], want[k])
		}
	}
}

// deep is a path of n nested descriptors, the last limited.
func deep(n int) string {
	var b strings.Builder
	for i := range n {
		indent := strings.Repeat("    ", i)
		b.WriteString(indent + "  - key: k" + string(rune('a'+i%26)) + strings.Repeat("x", i/26) + "\n")
		if i == n-1 {
			b.WriteString(indent + "    rate_limit: {unit: hour, requests_per_unit: 1}\n")
		} else {
			b.WriteString(indent + "    descriptors:\n")
		}
	}
	return b.String()
}

// The deepest path a request descriptor can have is translated.
func TestEnvoyConfigTakesAPathAsDeepAsADescriptor(t *testing.T) {
	cfg, err := fromEnvoy(t, "domain: edge\ndescriptors:\n"+deep(32))
	if err != nil {
		t.Fatal(err)
	}
	if rules := cfg.Domains["edge"].Rules; len(rules) != 1 || len(rules[0].Key) != 32 {
		t.Errorf("rules %+v: want one of 32 keys", rules)
	}
}

func TestEnvoyConfigRefusesADomainInTwoFiles(t *testing.T) {
	_, err := FromEnvoy([]EnvoyFile{
		{Name: "a.yaml", Data: []byte("domain: edge\n")},
		{Name: "b.yaml", Data: []byte("domain: edge\n")},
	})
	if want := "envoy rules b.yaml: duplicate domain \"edge\", also in a.yaml"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want %q", err, want)
	}
}

func TestEnvoyConfigRefusesFilesOverAConfigMapsSize(t *testing.T) {
	big := "domain: edge\n#" + strings.Repeat("x", maxRulesBytes) + "\n"
	_, err := FromEnvoy([]EnvoyFile{{Name: "a.yaml", Data: []byte(big)}})
	if err == nil || !strings.Contains(err.Error(), "over 1048576 bytes") {
		t.Fatalf("got %v, want the size bound", err)
	}
}

func TestDetectFormatTellsTheFormatsApartAndRefusesAMix(t *testing.T) {
	for _, tc := range []struct{ yml, want, err string }{
		{"domains: {}\n", FormatKurz, ""},
		{"", FormatKurz, ""},
		{"domain: edge\n", FormatEnvoy, ""},
		{"descriptors: []\n", FormatEnvoy, ""},
		{"domain: edge\ndomains: {}\n", "", "both kurz's top-level keys"},
	} {
		got, err := DetectFormat([]byte(tc.yml))
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("DetectFormat(%q) = %q, %v; want %q, %q", tc.yml, got, err, tc.want, tc.err)
		}
	}
}

// A directory is read as envoyproxy/ratelimit reads its runtime config
// directory from a mounted ConfigMap: every file whatever its name (links
// into ..data), not the dot entries; a file that is not rules, or a
// subdirectory, is refused (envoyproxy/ratelimit refuses the one, reads
// the other).
func TestReadFileTakesAConfigMapDirectoryOfEnvoyFiles(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "..2026_12_06_22_00_00.1")
	must(t, os.Mkdir(data, 0o755))
	must(t, os.WriteFile(filepath.Join(data, "edge.yaml"), []byte("domain: edge\ndescriptors: [{key: ip, rate_limit: {unit: second, requests_per_unit: 5}}]\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(data, "api.yaml"), []byte("domain: api\ndescriptors: [{key: user, rate_limit: {unit: minute, requests_per_unit: 9}}]\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(data, "ratelimit.conf"), []byte("domain: conf\ndescriptors: [{key: user, rate_limit: {unit: hour, requests_per_unit: 3}}]\n"), 0o644))
	must(t, os.Symlink(filepath.Base(data), filepath.Join(dir, "..data")))
	for _, f := range []string{"edge.yaml", "api.yaml", "ratelimit.conf"} {
		must(t, os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f)))
	}
	cfg, err := ReadFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]ratelimit.RuleSpec{
		"edge": {rule("ip", []string{"ip"}, nil, 5, "1s")},
		"api":  {rule("user", []string{"user"}, nil, 9, "1m")},
		"conf": {rule("user", []string{"user"}, nil, 3, "1h")},
	}
	if len(cfg.Domains) != 3 || !reflect.DeepEqual(cfg.Domains["edge"].Rules, want["edge"]) || !reflect.DeepEqual(cfg.Domains["api"].Rules, want["api"]) || !reflect.DeepEqual(cfg.Domains["conf"].Rules, want["conf"]) {
		t.Errorf("domains %+v, want %+v", cfg.Domains, want)
	}

	readme := filepath.Join(dir, "README")
	must(t, os.WriteFile(readme, []byte("not rules"), 0o644))
	if _, err := ReadFile(dir); err == nil || !strings.Contains(err.Error(), "README") {
		t.Errorf("a README in the directory: got %v, want it refused by name", err)
	}
	must(t, os.Remove(readme))
	sub := filepath.Join(dir, "more")
	must(t, os.Mkdir(sub, 0o755))
	if _, err := ReadFile(dir); err == nil || !strings.Contains(err.Error(), "more: a subdirectory") {
		t.Errorf("a subdirectory: got %v, want it refused by name", err)
	}
	must(t, os.Remove(sub))

	must(t, os.WriteFile(filepath.Join(dir, "kurz.yaml"), []byte("domains: {}\n"), 0o644))
	if _, err := ReadFile(dir); err == nil || !strings.Contains(err.Error(), "kurz.yaml: not an envoyproxy/ratelimit file") {
		t.Errorf("a kurz file in the directory: got %v, want it refused by name", err)
	}
}

func TestReadFileDetectsAnEnvoyFileAndAKurzFile(t *testing.T) {
	dir := t.TempDir()
	envoy, kurz, mixed := filepath.Join(dir, "envoy.yaml"), filepath.Join(dir, "kurz.yaml"), filepath.Join(dir, "mixed.yaml")
	must(t, os.WriteFile(envoy, []byte("domain: edge\ndescriptors: [{key: ip, rate_limit: {unit: second, requests_per_unit: 5}}]\n"), 0o644))
	must(t, os.WriteFile(kurz, []byte("domains: {api: {rules: [{name: a, key: [ip], algorithm: token_bucket, limit: 1, window: 1s, failure_mode: open}]}}\n"), 0o644))
	must(t, os.WriteFile(mixed, []byte("domain: edge\ndomains: {}\n"), 0o644))
	if cfg, err := ReadFile(envoy); err != nil || len(cfg.Domains["edge"].Rules) != 1 {
		t.Errorf("envoy file: %+v, %v", cfg, err)
	}
	if cfg, err := ReadFile(kurz); err != nil || len(cfg.Domains["api"].Rules) != 1 {
		t.Errorf("kurz file: %+v, %v", cfg, err)
	}
	if _, err := ReadFile(mixed); err == nil || !strings.Contains(err.Error(), "keep one format per file") {
		t.Errorf("mixed file: got %v, want it refused", err)
	}
}

// A rules file over 1 MiB (a ConfigMap's bound) is refused before it is
// parsed, in either format, naming its size and the bound; one of exactly
// 1 MiB is read. KURZ_LIMITER_RULES_FILE is read at every refresh and
// seeds the rule tables: a huge file would be read whole each time.
func TestReadFileRefusesAFileOverAConfigMapsSizeInEitherFormat(t *testing.T) {
	for format, rules := range map[string]string{
		FormatKurz:  "domains: {api: {rules: [{name: a, key: [ip], algorithm: token_bucket, limit: 1, window: 1s, failure_mode: open}]}}\n",
		FormatEnvoy: "domain: edge\ndescriptors: [{key: ip, rate_limit: {unit: second, requests_per_unit: 5}}]\n",
	} {
		path := filepath.Join(t.TempDir(), "rules.yaml")
		padded := func(size int) []byte { // rules, then a comment up to size bytes
			return []byte(rules + "#" + strings.Repeat("x", size-len(rules)-2) + "\n")
		}
		must(t, os.WriteFile(path, padded(maxRulesBytes), 0o644))
		if _, err := ReadFile(path); err != nil {
			t.Errorf("%s file of exactly %d bytes: %v, want it read", format, maxRulesBytes, err)
		}
		must(t, os.WriteFile(path, padded(3*maxRulesBytes), 0o644))
		want := fmt.Sprintf("%s: %d bytes, over the %d bytes", path, 3*maxRulesBytes, maxRulesBytes)
		if _, err := ReadFile(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s file of %d bytes: got %v, want %q", format, 3*maxRulesBytes, err, want)
		}
	}
}

// What `limiter rules from-envoy` prints is a kurz rules file that parses
// back to the translation.
func TestEnvoyTranslationWritesOutAsAKurzRulesFile(t *testing.T) {
	cfg, err := fromEnvoy(t, `
domain: edge
descriptors:
  - key: generic_key
    value: api
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - {key: remote_address, shadow_mode: true, rate_limit: {unit: second, requests_per_unit: 3}}
  - {key: user, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: user, value: "x y", rate_limit: {unlimited: true}}
`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := ratelimit.Compile(back); err != nil {
		t.Fatalf("written out, it does not compile: %v\n%s", err, out)
	}
	if want := "unlimited: true"; !strings.Contains(string(out), want) || strings.Contains(string(out), "limit: 1099511627776") {
		t.Errorf("written out:\n%s\nwant the unlimited descriptor as a rule with %q, no limit", out, want)
	}
	if !reflect.DeepEqual(back.Domains, cfg.Domains) {
		t.Errorf("read back:\n%+v\nwant\n%+v", back.Domains, cfg.Domains)
	}
}

// The file source rereads an envoyproxy/ratelimit directory at every
// refresh: a change applies, and a file that stops translating keeps the
// last good rules.
func TestRefreshRereadsAnEnvoyDirectoryAndKeepsTheLastGoodRules(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "edge.yaml")
	write := func(yml string) { must(t, os.WriteFile(file, []byte(yml), 0o644)) }
	var applied *ratelimit.Ruleset
	r := &Refresher{Source: FileSource{Path: dir}, Interval: time.Hour, Log: slog.New(slog.DiscardHandler),
		Apply: func(rs *ratelimit.Ruleset) { applied = rs }}
	limit := func() int64 {
		t.Helper()
		got := applied.MatchEnvoy("edge", map[string]string{"ip": "10.0.0.1"})
		if len(got) != 1 {
			t.Fatalf("%d rules for ip, want 1", len(got))
		}
		return got[0].Rule.Limit
	}

	write("domain: edge\ndescriptors: [{key: ip, rate_limit: {unit: second, requests_per_unit: 5}}]\n")
	must(t, r.Refresh(context.Background()))
	if got := limit(); got != 5 {
		t.Fatalf("limit %d, want 5", got)
	}
	write("domain: edge\ndescriptors: [{key: ip, rate_limit: {unit: second, requests_per_unit: 7}}]\n")
	must(t, r.Refresh(context.Background()))
	if got := limit(); got != 7 {
		t.Fatalf("after the edit: limit %d, want 7", got)
	}
	write("domain: edge\ndescriptors: [{key: ip, value: \"10.*.1\", rate_limit: {unit: second, requests_per_unit: 1}}]\n")
	if err := r.Refresh(context.Background()); err == nil || !strings.Contains(err.Error(), "takes a '*' before the end") {
		t.Fatalf("refresh of a mid-value star: %v, want its refusal", err)
	}
	if got := limit(); got != 7 {
		t.Fatalf("after a refused file: limit %d, want the last good 7", got)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// FuzzFromEnvoy feeds arbitrary bytes to the translator: it never panics,
// and what it returns compiles.
func FuzzFromEnvoy(f *testing.F) {
	for _, s := range []string{
		"",
		"domain: edge\n",
		"domain: edge\ndescriptors: [{key: ip, rate_limit: {unit: second, requests_per_unit: 5}}]\n",
		"domain: edge\ndescriptors:\n  - {key: a, value: x, descriptors: [{key: b, rate_limit: {unit: hour, requests_per_unit: 1}}]}\n  - {key: a, descriptors: [{key: b, value: y, rate_limit: {unit: hour, requests_per_unit: 2}}]}\n",
		"domain: edge\ndescriptors:\n  - {key: user, rate_limit: {unit: hour, requests_per_unit: 10}}\n  - {key: user, value: vip, shadow_mode: true, rate_limit: {unit: hour, requests_per_unit: 1000}}\n  - {key: user, value: free, rate_limit: {unlimited: true}}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := FromEnvoy([]EnvoyFile{{Name: "f.yaml", Data: data}})
		if err != nil {
			return
		}
		if _, err := ratelimit.Compile(cfg); err != nil {
			t.Fatalf("translated but does not compile: %v\n%s", err, data)
		}
	})
}

// With envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG (KURZ_LIMITER_ENVOY_MERGE_DOMAINS)
// a directory's files of one domain are merged, their top-level
// descriptors in file order, read by the file source (a FileSource's
// Envoy) as by FromEnvoyDir; without it they are refused.
func TestEnvoyDirectoryMergesADomainsFilesWithMergeDomains(t *testing.T) {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: edge\ndescriptors: [{key: ip, rate_limit: {unit: second, requests_per_unit: 5}}]\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "b.yaml"), []byte("domain: edge\ndescriptors: [{key: path, value: /api/*, rate_limit: {unit: minute, requests_per_unit: 60}}]\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "c.yaml"), []byte("domain: api\ndescriptors: [{key: user, rate_limit: {unit: hour, requests_per_unit: 3}}]\n"), 0o644))

	if _, err := ReadFile(dir); err == nil || !strings.Contains(err.Error(), `b.yaml: duplicate domain "edge"`) {
		t.Errorf("without merging: got %v, want the domain in two files refused", err)
	}
	cfg, err := FileSource{Path: dir, Envoy: EnvoyOptions{MergeDomains: true}}.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	edge := cfg.Domains["edge"].Rules
	if len(cfg.Domains) != 2 || len(edge) != 2 || edge[0].Name != "ip" || !reflect.DeepEqual(edge[1].Match, map[string]string{"path": "/api/*"}) || len(cfg.Domains["api"].Rules) != 1 {
		t.Errorf("merged: %+v; want edge's rules of a.yaml then b.yaml, and api", cfg.Domains)
	}
	files, err := envoydir.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	applied, err := FromEnvoyDir(files, EnvoyOptions{MergeDomains: true})
	if err != nil || !reflect.DeepEqual(applied, cfg) {
		t.Errorf("FromEnvoyDir merged: %+v, %v; want the file source's %+v", applied, err, cfg)
	}
}

// Merging refuses what envoyproxy/ratelimit refuses when it patches a
// domain (config_impl.go, loadConfig then loadDescriptors): a top-level
// descriptor (its composite key) a file before had, named in the file
// that repeats it; and what kurz refuses of the tree the files make
// together names them all.
func TestEnvoyMergeRefusesADescriptorTwiceAndNamesTheFiles(t *testing.T) {
	merge := EnvoyOptions{MergeDomains: true}
	_, err := FromEnvoyDir([]envoydir.File{
		{Name: "a.yaml", Data: []byte("domain: edge\ndescriptors: [{key: ip, rate_limit: {unit: second, requests_per_unit: 5}}]\n")},
		{Name: "b.yaml", Data: []byte("domain: edge\ndescriptors: [{key: ip, descriptors: [{key: user, rate_limit: {unit: second, requests_per_unit: 1}}]}]\n")},
	}, merge)
	if want := `envoy rules b.yaml, domain edge, descriptor ip: duplicate descriptor composite key "ip"`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("one top-level key in two files: got %v, want %q", err, want)
	}
	// user and user_vip side by side, one from each file.
	_, err = FromEnvoyDir([]envoydir.File{
		{Name: "a.yaml", Data: []byte("domain: edge\ndescriptors: [{key: user, rate_limit: {unit: second, requests_per_unit: 5}}]\n")},
		{Name: "b.yaml", Data: []byte("domain: edge\ndescriptors: [{key: user_vip, rate_limit: {unit: second, requests_per_unit: 1}}]\n")},
	}, merge)
	if err == nil || !strings.Contains(err.Error(), "b.yaml") {
		t.Errorf("a spelling clash across files: got %v, want it refused naming b.yaml", err)
	}
}
