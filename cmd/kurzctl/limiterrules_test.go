//go:build integration

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// rules get prints the rules file and its etag; rules apply of it changes
// nothing; a dry run prints the changes and writes nothing; an apply
// prints them and the new etag, and --if-match with the old etag is then
// refused. A domain of the test's own, removed at the end: the limiter's
// tables are shared.
func TestRulesGetAndApply(t *testing.T) {
	gw := startGateway(t, stack.LimiterPG)
	c := newCtl(t, gw)
	domain := "ctltest-" + strings.TrimPrefix(newTenantID(t), "ctl-")
	t.Cleanup(func() {
		if _, err := stack.DB.Exec(context.Background(), `DELETE FROM rl_domains WHERE domain = $1`, domain); err != nil {
			t.Errorf("clean up: %v", err)
		}
	})
	r := c.run("rules", "get")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "domains:") || !strings.HasPrefix(r.stderr, "etag: ") {
		t.Fatalf("rules get: %s", r)
	}
	etag := strings.Fields(r.stderr)[1]
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, []byte(r.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := c.ok("rules", "apply", file, "--if-match", etag); out != "no changes\netag: "+etag+"\n" {
		t.Errorf("rules apply of the export:\n%s", out)
	}
	mine := fmt.Sprintf("domains:\n  %s:\n    rules:\n      - {name: per-ip, key: [ip], algorithm: fixed_window, limit: 5, window: 1s, failure_mode: open}\n", domain)
	c.stdin = mine
	out := c.ok("rules", "apply", "-", "--dry-run")
	if !strings.Contains(out, "domain "+domain+" added\n") || !strings.Contains(out, "rule   "+domain+"/per-ip added\n") || !strings.Contains(out, "dry run: nothing written") {
		t.Errorf("rules apply --dry-run:\n%s", out)
	}
	out = c.ok("rules", "apply", "-", "--if-match", etag)
	if !strings.Contains(out, "rule   "+domain+"/per-ip added\n") || strings.Contains(out, "etag: "+etag) {
		t.Errorf("rules apply:\n%s", out)
	}
	if got := decodeJSON(t, c.ok("rules", "get", "-o", "json")); got["domains"].(map[string]any)[domain] == nil {
		t.Errorf("rules get -o json lacks the applied domain")
	}
	c.stdin = strings.Replace(mine, "limit: 5", "limit: 6", 1)
	if r := c.run("rules", "apply", "-", "--if-match", etag); r.code != 1 || !strings.Contains(r.stderr, "the rules changed since they were read") {
		t.Errorf("rules apply with a stale --if-match: %s", r)
	}
	c.stdin = strings.Replace(mine, "fixed_window", "fixed_windows", 1)
	if r := c.run("rules", "apply", "-"); r.code != 1 || !strings.Contains(r.stderr, "rule "+domain+`/per-ip: algorithm "fixed_windows"`) {
		t.Errorf("rules apply of a rule that does not compile: %s", r)
	}

	// An envoyproxy/ratelimit file of the same domain replaces it, the
	// output saying how the file was read.
	c.stdin = fmt.Sprintf("domain: %s\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 2, name: envoy-per-ip}\n", domain)
	out = c.ok("rules", "apply", "-")
	if !strings.HasPrefix(out, "read as an envoyproxy/ratelimit file") || !strings.Contains(out, "rule   "+domain+"/envoy-per-ip added\n") || !strings.Contains(out, "rule   "+domain+"/per-ip removed\n") {
		t.Errorf("rules apply of an envoyproxy/ratelimit file:\n%s", out)
	}
}

// rules apply DIR applies a directory of envoyproxy/ratelimit files (a
// mounted ConfigMap's: ..data and links) in one request, every file's
// domain; what the limiter's file source refuses of a directory (a
// subdirectory, a kurz rules file among them, the same domain twice) it
// refuses, naming the file, and nothing is written. The test's own
// domains, removed at the end.
func TestRulesApplyADirectory(t *testing.T) {
	gw := startGateway(t, stack.LimiterPG)
	c := newCtl(t, gw)
	id := strings.TrimPrefix(newTenantID(t), "ctl-")
	one, two := "ctldir1-"+id, "ctldir2-"+id
	t.Cleanup(func() {
		if _, err := stack.DB.Exec(context.Background(), `DELETE FROM rl_domains WHERE domain = ANY($1)`, []string{one, two}); err != nil {
			t.Errorf("clean up: %v", err)
		}
	})
	file := func(domain string) string {
		return fmt.Sprintf("domain: %s\ndescriptors: [{key: remote_address, rate_limit: {unit: second, requests_per_unit: 5}}]\n", domain)
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "..2026_12_07_04_00_00.1")
	write := func(path, content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(data, "one.yaml"), file(one))
	write(filepath.Join(data, "ratelimit.conf"), file(two))
	for _, link := range [][2]string{{filepath.Base(data), "..data"}, {"..data/one.yaml", "one.yaml"}, {"..data/ratelimit.conf", "ratelimit.conf"}} {
		if err := os.Symlink(link[0], filepath.Join(dir, link[1])); err != nil {
			t.Fatal(err)
		}
	}

	refused := func(what, want string) {
		t.Helper()
		if r := c.run("rules", "apply", dir); r.code == 0 || !strings.Contains(r.stderr, want) {
			t.Errorf("rules apply of a directory with %s: %s; want it refused with %q", what, r, want)
		}
	}
	sub := filepath.Join(dir, "more")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	refused("a subdirectory", "more: a subdirectory")
	if err := os.Remove(sub); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(dir, "kurz.yaml"), "domains: {}\n")
	refused("a kurz rules file", "kurz.yaml: not an envoyproxy/ratelimit file")
	write(filepath.Join(dir, "kurz.yaml"), file(one))
	refused("the same domain twice", `duplicate domain "`+one+`"`)
	if err := os.Remove(filepath.Join(dir, "kurz.yaml")); err != nil {
		t.Fatal(err)
	}
	if got := decodeJSON(t, c.ok("rules", "get", "-o", "json")); got["domains"].(map[string]any)[one] != nil {
		t.Fatalf("the refusals wrote %s", one)
	}

	out := c.ok("rules", "apply", dir, "--dry-run")
	for _, want := range []string{"read as an envoyproxy/ratelimit file", "domain " + one + " added\n", "domain " + two + " added\n", "dry run: nothing written"} {
		if !strings.Contains(out, want) {
			t.Errorf("rules apply DIR --dry-run lacks %q:\n%s", want, out)
		}
	}
	out = c.ok("rules", "apply", dir)
	if !strings.Contains(out, "rule   "+one+"/remote_address added\n") || !strings.Contains(out, "rule   "+two+"/remote_address added\n") {
		t.Errorf("rules apply DIR:\n%s", out)
	}
	got := decodeJSON(t, c.ok("rules", "get", "-o", "json"))["domains"].(map[string]any)
	if got[one] == nil || got[two] == nil {
		t.Errorf("rules get after rules apply DIR lacks %s or %s", one, two)
	}

	// A second file of one's domain: refused, unless --merge-domains
	// (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG) merges it in.
	write(filepath.Join(dir, "one-more.yaml"), fmt.Sprintf("domain: %s\ndescriptors: [{key: path, value: /api/*, rate_limit: {unit: minute, requests_per_unit: 60}}]\n", one))
	refused("one domain in two files", `duplicate domain "`+one+`"`)
	out = c.ok("rules", "apply", dir, "--merge-domains")
	if !strings.Contains(out, "rule   "+one+"/path_-api---") || strings.Contains(out, "removed") {
		t.Errorf("rules apply DIR --merge-domains:\n%s", out)
	}
	if r := c.run("rules", "apply", filepath.Join(dir, "one.yaml"), "--merge-domains"); r.code != 2 || !strings.Contains(r.stderr, "--merge-domains merges the files of a directory") {
		t.Errorf("rules apply FILE --merge-domains: %s; want a usage error", r)
	}
}
