package rulestore

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"kurz.dev/services/limiter/internal/ratelimit"
)

// The shipped rules, written out as an export writes them, parse and
// compile back to the same rules, and writing those out again gives the
// same bytes: the etag of unchanged rules never moves.
func TestExportedRulesParseBackToTheSameRules(t *testing.T) {
	cfg, err := Parse(Bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Tenants = nil
	out, err := Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "tenants") {
		t.Errorf("the export has a tenants section; tenants' plans have their own API:\n%s", out)
	}
	back, err := Parse(out)
	if err != nil {
		t.Fatalf("the export does not parse: %v\n%s", err, out)
	}
	if _, err := ratelimit.Compile(back); err != nil {
		t.Fatalf("the export does not compile: %v", err)
	}
	if !reflect.DeepEqual(fieldsOf(back), fieldsOf(cfg)) {
		t.Errorf("the export parses to other rules:\n%s", out)
	}
	again, err := Marshal(back)
	if err != nil {
		t.Fatal(err)
	}
	if ETag(again) != ETag(out) {
		t.Errorf("writing the parsed export again changes its etag:\n%s\n---\n%s", out, again)
	}
	if diff := diff(cfg, back); len(diff) != 0 {
		t.Errorf("the export differs from the rules by %v", diff)
	}
}

// diff names each domain, rule, plan and limit added, removed or changed,
// with the fields (as the rules file spells them) and a rule's move.
func TestDiffNamesEveryChangeAndItsFields(t *testing.T) {
	parse := func(src string) ratelimit.Config {
		t.Helper()
		cfg, err := Parse([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	cur := parse(`
domains:
  api:
    rules:
      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
      - {name: b, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
  old:
    rules:
      - {name: x, key: [ip], algorithm: fixed_window, limit: 1, window: 1s, failure_mode: open}
plans:
  free: {api/a: {limit: 5}, api/b: {limit: 4}}
  gone: {}
`)
	next := parse(`
domains:
  api:
    defaults: {algo: tb}
    rules:
      - {name: b, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open, burst: 20}
      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
      - {name: c, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
  new:
    rules: []
plans:
  free: {api/a: {limit: 6, window: 2s}, api/c: {limit: 3}}
  pro: {}
`)
	var got []string
	for _, c := range diff(cur, next) {
		got = append(got, c.String())
	}
	want := []string{
		"domain api changed (defaults)",
		"rule api/a changed (position)",
		"rule api/b changed (burst, position)",
		"rule api/c added",
		"domain new added",
		"domain old removed",
		"rule old/x removed",
		"limit free api/a changed (limit, window)",
		"limit free api/b removed",
		"limit free api/c added",
		"plan gone removed",
		"plan pro added",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("diff:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A file given to Apply is told by its content as the file source tells
// it: an envoyproxy/ratelimit file is read through FromEnvoy (its domain a
// kurz domain of the same name) and said to be one; kurz's own, YAML or
// JSON, is parsed; one with both formats' keys, and an Envoy tree kurz
// would decide otherwise, are refused as invalid, naming why.
func TestParseAppliedTellsTheFormatAndTranslatesEnvoyFiles(t *testing.T) {
	const envoy = `
domain: edge
descriptors:
  - key: generic_key
    value: api
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: remote_address
        rate_limit: {unit: second, requests_per_unit: 3, name: per-ip}
`
	want, err := fromEnvoy(t, envoy)
	if err != nil {
		t.Fatal(err)
	}
	got, format, err := parseApplied([]byte(envoy))
	if err != nil || format != FormatEnvoy {
		t.Fatalf("an envoyproxy/ratelimit file: %q, %v; want it read as %q", format, err, FormatEnvoy)
	}
	if !reflect.DeepEqual(fieldsOf(got), fieldsOf(want)) {
		t.Errorf("an envoyproxy/ratelimit file applies as %+v; want its translation %+v", got, want)
	}

	for _, kurz := range []string{
		"domains:\n  edge:\n    rules:\n      - {name: per-ip, key: [ip], algorithm: fixed_window, limit: 5, window: 1s, failure_mode: open}\n",
		`{"domains": {"edge": {"rules": [{"name": "per-ip", "key": ["ip"], "algorithm": "fixed_window", "limit": 5, "window": "1s", "failure_mode": "open"}]}}}`,
	} {
		cfg, format, err := parseApplied([]byte(kurz))
		if err != nil || format != FormatKurz || len(cfg.Domains["edge"].Rules) != 1 {
			t.Errorf("a kurz file %s: %q, %+v, %v; want it read as %q", kurz, format, cfg, err, FormatKurz)
		}
	}

	for _, c := range []struct{ name, file, says string }{
		{"both formats' keys", "domain: edge\ndomains: {}\n", "keep one format per file"},
		{"a star before a value's end", "domain: edge\ndescriptors:\n  - key: path\n    value: /api/*/x\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "path=/api/*/x"},
		{"a misspelt Envoy field", "domain: edge\ndescriptors:\n  - key: path\n    rate_limit: {unit: second, requests_per_unit: 1, nme: x}\n", "field nme not found"},
	} {
		if _, _, err := parseApplied([]byte(c.file)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v; want %v saying %q", c.name, err, ErrInvalid, c.says)
		}
	}
}
