package rulestore

import (
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
