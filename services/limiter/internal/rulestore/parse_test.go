package rulestore

import (
	"testing"

	"kurz.dev/services/limiter/internal/ratelimit"
)

func TestParseRejectsUnknownFields(t *testing.T) {
	_, err := Parse([]byte(`
domains:
  api:
    rules:
      - {name: a, key: [ip], algoritm: token_bucket, limit: 10, window: 1s, failure_mode: open}
`))
	if err == nil {
		t.Fatal("want an error for the misspelt field")
	}
}

// A second YAML document would be dropped unread: it is an error.
func TestParseRejectsASecondDocument(t *testing.T) {
	_, err := Parse([]byte(`
domains:
  x: {rules: [{name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}]}
---
domains:
  y: {rules: [{name: b, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}]}
`))
	if err == nil {
		t.Fatal("two documents parsed without an error; want one naming the second document")
	}
}

func TestBootstrapFileCompiles(t *testing.T) {
	cfg, err := Parse(Bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ratelimit.Compile(cfg); err != nil {
		t.Fatal(err)
	}
	for _, domain := range []string{"demo", "demo.race", "api", "links.create", "redirect.miss", "links.password", "clicks", "auth"} {
		if _, ok := cfg.Domains[domain]; !ok {
			t.Errorf("bootstrap lacks domain %s", domain)
		}
	}
}
