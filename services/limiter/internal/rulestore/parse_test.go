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
