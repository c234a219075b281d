package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"
)

// result is one kurzctl run.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// ctl runs kurzctl commands in process against one gateway, with the
// settings in its environment (never the test process's).
type ctl struct {
	t     *testing.T
	env   map[string]string
	stdin string
}

// withKey returns a copy of c that uses an API key.
func (c *ctl) withKey(key string) *ctl {
	d := *c
	d.env = maps.Clone(c.env)
	d.env["KURZ_API_KEY"] = key
	return &d
}

// run runs one command line.
func (c *ctl) run(args ...string) result {
	c.t.Helper()
	var stdout, stderr bytes.Buffer
	lookup := func(name string) (string, bool) {
		v, ok := c.env[name]
		return v, ok
	}
	code := runIO(context.Background(), args, strings.NewReader(c.stdin), &stdout, &stderr, lookup)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// ok runs a command that must succeed, and returns its stdout.
func (c *ctl) ok(args ...string) string {
	c.t.Helper()
	r := c.run(args...)
	if r.code != 0 {
		c.t.Fatalf("kurzctl %s: %s", strings.Join(args, " "), r)
	}
	if strings.Contains(r.stderr, "goroutine ") || strings.Contains(r.stderr, "panic") {
		c.t.Fatalf("kurzctl %s wrote a trace: %s", strings.Join(args, " "), r.stderr)
	}
	return r.stdout
}

// decodeJSON parses one JSON document of a command's -o json output; the
// test fails if it is not exactly one.
func decodeJSON(t *testing.T, out string) map[string]any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(out))
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("output is not a JSON object: %v\n%s", err, out)
	}
	if dec.More() {
		t.Fatalf("output holds more than one JSON document:\n%s", out)
	}
	return m
}

// A mistake on the command line exits 2 with what to fix and where the
// help is, before anything is sent.
func TestUsageErrorsExitTwo(t *testing.T) {
	c := &ctl{t: t, env: map[string]string{"KURZ_URL": "http://127.0.0.1:1"}}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "kurzctl: no command given"},
		{"unknown command", []string{"shorten"}, `kurzctl: unknown command "shorten"`},
		{"unknown subcommand", []string{"links", "shorten"}, `kurzctl links: unknown command "links shorten"`},
		{"missing argument", []string{"links", "create"}, "kurzctl links create: missing <long-url>"},
		{"extra argument", []string{"links", "get", "a", "b"}, `kurzctl links get: unexpected argument "b"`},
		{"unknown flag", []string{"links", "list", "--colour"}, "unknown flag: --colour"},
		{"bad redirect", []string{"links", "create", "https://example.com", "--redirect", "303"}, "--redirect 303: want 301, 302, 307 or 308"},
		{"two code modes", []string{"links", "create", "https://example.com", "--from-url", "--random"}, "give one of --alias, --random and --from-url"},
		{"bad expire", []string{"links", "create", "https://example.com", "--expire", "soon"}, `--expire: "soon" is neither an RFC 3339 time`},
		{"empty idempotency key", []string{"links", "create", "https://example.com", "--idempotency-key", ""}, "--idempotency-key: an idempotency key is 1 to 255 characters"},
		{"span expiry with an idempotency key", []string{"links", "create", "https://example.com", "--expire", "30d", "--idempotency-key", "k"}, "--expire 30d with --idempotency-key: give an RFC 3339 time"},
		{"non-ASCII idempotency key", []string{"links", "create", "https://example.com", "--idempotency-key", "schlüssel"}, "--idempotency-key: an idempotency key holds printable ASCII only"},
		{"bad output", []string{"links", "list", "-o", "xml"}, `--output "xml": want table, json or yaml`},
		{"bad url", []string{"--url", "127.0.0.1:8080", "links", "list"}, `--url "127.0.0.1:8080": want the gateway's base URL`},
		{"nothing to update", []string{"links", "update", "abc1234"}, "nothing to change"},
		{"conflicting flags", []string{"links", "update", "abc1234", "--enable", "--disable"}, "give --disable or --enable, not both"},
		{"bad interval", []string{"stats", "abc1234", "--interval", "week"}, `--interval "week": want hour or day`},
		{"since and start", []string{"stats", "abc1234", "--since", "7d", "--start", "2026-01-01"}, "give --since, or --start and --end, not both"},
		{"no domain", []string{"quota", "explain", "--descriptor", "tenant=acme"}, "--domain is required"},
		{"bad descriptor", []string{"quota", "check", "--domain", "api", "--descriptor", "tenant"}, `--descriptor "tenant": want name=value`},
		{"no admin token", []string{"tenants", "get", "acme"}, "set --admin-token or KURZ_GATEWAY_ADMIN_TOKEN"},
		{"bad batch", []string{"links", "import", "x.csv", "--batch", "0"}, "--batch must be from 1 to 1000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := c.run(tt.args...)
			if r.code != exitUsage || !strings.Contains(r.stderr, tt.want) || !strings.Contains(r.stderr, "-h' for usage") {
				t.Errorf("%s\nwant exit 2 with %q and a pointer to -h", r, tt.want)
			}
		})
	}
}

// A secret given as --api-key or --admin-token is in the command line,
// which ps shows to other users: the flags' help says so and names the
// environment variable and the --*-stdin flag that keep it out.
func TestHelpSecretFlagsWarnOfPS(t *testing.T) {
	c := &ctl{t: t, env: map[string]string{}}
	out := c.ok("-h")
	for flag, ways := range map[string][]string{
		"--api-key key":       {"KURZ_API_KEY", "config set-context --api-key-stdin"},
		"--admin-token token": {adminTokenEnv, "config set-context --admin-token-stdin"},
	} {
		_, line, _ := strings.Cut(out, flag)
		line, _, _ = strings.Cut(line, "\n")
		if !strings.Contains(line, "shows in ps") {
			t.Errorf("kurzctl -h: %s's help %q does not say the secret shows in ps", flag, line)
		}
		for _, w := range ways {
			if !strings.Contains(line, w) {
				t.Errorf("kurzctl -h: %s's help %q does not name %s", flag, line, w)
			}
		}
	}
}

// Every command has help with examples, on stdout, exit 0; so do the groups
// and kurzctl itself.
func TestHelp(t *testing.T) {
	c := &ctl{t: t, env: map[string]string{}}
	for _, cmd := range commands {
		for _, args := range [][]string{append(strings.Fields(cmd.name), "-h"), append([]string{"help"}, strings.Fields(cmd.name)...)} {
			out := c.ok(args...)
			if !strings.HasPrefix(out, "Usage: kurzctl "+cmd.name) || !strings.Contains(out, "Example") || !strings.Contains(out, "--output") {
				t.Errorf("kurzctl %s:\n%s", strings.Join(args, " "), out)
			}
		}
	}
	for _, args := range [][]string{{"-h"}, {"-help"}, {"help"}, {"links", "-h"}, {"quota", "--help"}} {
		if out := c.ok(args...); !strings.Contains(out, "Usage:") || !strings.Contains(out, "kurzctl help") {
			t.Errorf("kurzctl %s:\n%s", strings.Join(args, " "), out)
		}
	}
	if out := c.ok("version"); !strings.HasPrefix(out, "kurzctl dev (go") {
		t.Errorf("version: %q", out)
	}
	decodeJSON(t, c.ok("version", "-o", "json"))
}
