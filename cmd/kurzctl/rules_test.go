//go:build integration

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Rules go through the gateway's REST API: set from a YAML file, shown,
// copied to another link through -o json, replaced in part, cleared; a
// file with a typo or a refused destination changes nothing.
func TestLinkRules(t *testing.T) {
	gw := startGateway(t, stack.Limiter)
	_, c := tenantWithKey(t, newCtl(t, gw), "free")
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(file, []byte(rulesExample), 0o600); err != nil {
		t.Fatal(err)
	}
	code := strings.TrimSpace(c.ok("links", "create", "https://example.com/landing", "--rules", file, "-q"))
	other := strings.TrimSpace(c.ok("links", "create", "https://example.com/other", "-q"))

	shown := c.ok("links", "rules", code)
	for _, want := range []string{"ios-de", "device ios; language de", "https://example.com/de/app", "ip in 203.0.113.0/24", "a        1"} {
		if !strings.Contains(shown, want) {
			t.Errorf("links rules: no %q in\n%s", want, shown)
		}
	}
	if got := field(t, c.ok("links", "get", code), "variants"); got != "a 1, b 1" {
		t.Errorf("links get: variants %q", got)
	}

	// Copy through -o json and stdin.
	c.stdin = c.ok("links", "rules", code, "-o", "json")
	c.ok("links", "set-rules", other, "-")
	c.stdin = ""
	copied := decodeJSON(t, c.ok("links", "rules", other, "-o", "json"))
	if rules, _ := copied["rules"].([]any); len(rules) != 2 {
		t.Fatalf("copied rules: %v", copied)
	}

	// Only the variants: the rules stay.
	if err := os.WriteFile(file, []byte("variants: [{name: only, url: 'https://example.com/only', weight: 5}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := c.ok("links", "set-rules", code, file)
	if !strings.Contains(out, "ios-de") || !strings.Contains(out, "only") || strings.Contains(out, "landing-a") {
		t.Errorf("set-rules with variants only:\n%s", out)
	}

	for name, content := range map[string]string{
		"typo":       "rules: [{name: x, conditon: [], url: 'https://example.com/'}]\n",
		"other keys": "longUrl: https://example.com/\n",
	} {
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if r := c.run("links", "set-rules", code, file); r.code != exitUsage {
			t.Errorf("%s: %s", name, r)
		}
	}
	if err := os.WriteFile(file, []byte("rules: [{name: x, conditions: [{languages: [de]}], url: 'javascript:alert(1)'}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := c.run("links", "set-rules", code, file); r.code != exitError || !strings.Contains(r.stderr, "rules[0].url") {
		t.Errorf("a javascript: rule: %s", r)
	}
	if !strings.Contains(c.ok("links", "rules", code), "ios-de") {
		t.Error("a refused file changed the rules")
	}

	out = c.ok("links", "set-rules", code, "--clear")
	if !strings.Contains(out, "no rules") || !strings.Contains(out, "no variants") {
		t.Errorf("set-rules --clear:\n%s", out)
	}
}
