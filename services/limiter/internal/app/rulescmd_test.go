package app

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kurz.dev/services/limiter/internal/ratelimit"
	"kurz.dev/services/limiter/internal/rulestore"
)

// `limiter rules from-envoy` prints a kurz rules file that the limiter
// reads back as the translation, and names what it refuses.
func TestRulesFromEnvoyPrintsAKurzRulesFile(t *testing.T) {
	dir := t.TempDir()
	envoy := filepath.Join(dir, "edge.yaml")
	if err := os.WriteFile(envoy, []byte(`domain: edge
descriptors:
  - key: generic_key
    value: api
    descriptors:
      - {key: remote_address, rate_limit: {unit: minute, requests_per_unit: 3}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := RulesCommand([]string{"from-envoy", envoy}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	cfg, err := rulestore.Parse(stdout.Bytes())
	if err != nil {
		t.Fatalf("output does not parse: %v\n%s", err, stdout.String())
	}
	want := ratelimit.RuleSpec{Name: "generic_key_api.remote_address", Key: []string{"generic_key", "remote_address"},
		Match: map[string]string{"generic_key": "api"}, Algorithm: "fixed_window", Limit: 3, Window: "1m", FailureMode: "open"}
	if r := cfg.Domains["edge"].Rules; len(r) != 1 || r[0].Name != want.Name || r[0].Limit != 3 || r[0].Window != "1m" || r[0].Match["generic_key"] != "api" {
		t.Errorf("rules %+v, want %+v", r, want)
	}

	if err := os.WriteFile(envoy, []byte("domain: edge\ndescriptors: [{key: p, value: \"a*b\", rate_limit: {unit: hour, requests_per_unit: 1}}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	if code := RulesCommand([]string{"from-envoy", envoy}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "takes a '*' before the end") || stdout.Len() > 0 {
		t.Errorf("a star mid-value: exit %d, stderr %q, stdout %q; want 1 and the refusal", code, stderr.String(), stdout.String())
	}
	if code := RulesCommand(nil, &stdout, &stderr); code != 2 {
		t.Errorf("no arguments: exit %d, want 2", code)
	}
}
