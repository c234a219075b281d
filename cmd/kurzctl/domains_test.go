//go:build integration

package main

import (
	"crypto/rand"
	"strings"
	"testing"
)

// Custom domains through kurzctl: add (with the TXT record to publish),
// approve as the administrator, a link on the domain with --domain beside
// the same alias on the default domain, get, update and delete by
// --domain, list, and delete the domain once its link is gone.
func TestDomains(t *testing.T) {
	gw := startGateway(t, stack.Limiter)
	admin := newCtl(t, gw)
	id, c := tenantWithKey(t, admin, "free")
	domain := "go-" + strings.ToLower(rand.Text()[:10]) + ".acme.test"

	out := c.ok("domains", "add", domain)
	if field(t, out, "domain") != domain || field(t, out, "verified") != "no" ||
		field(t, out, "TXT record") != "_kurz-challenge."+domain || !strings.HasPrefix(field(t, out, "TXT value"), "kurz-verify=") {
		t.Errorf("domains add:\n%s", out)
	}
	if r := c.run("links", "create", "https://example.com/x", "--domain", domain); r.code != exitError || !strings.Contains(r.stderr, "not one of your verified domains") {
		t.Errorf("a link on the unverified domain: %s", r)
	}
	if out := admin.ok("domains", "approve", id, domain); !strings.Contains(field(t, out, "verified"), "(admin)") {
		t.Errorf("domains approve:\n%s", out)
	}

	alias := "k" + strings.ToLower(rand.Text()[:8])
	out = c.ok("links", "create", "https://example.com/custom", "--alias", alias, "--domain", domain)
	if field(t, out, "domain") != domain || field(t, out, "short url") != "https://"+domain+"/"+alias {
		t.Errorf("links create --domain:\n%s", out)
	}
	c.ok("links", "create", "https://example.com/default", "--alias", alias)
	if got := field(t, c.ok("links", "get", alias, "--domain", domain), "long url"); got != "https://example.com/custom" {
		t.Errorf("links get --domain: long url %q", got)
	}
	if got := field(t, c.ok("links", "get", alias), "long url"); got != "https://example.com/default" {
		t.Errorf("links get: long url %q", got)
	}
	if got := field(t, c.ok("links", "update", alias, "--domain", domain, "--long-url", "https://example.com/changed"), "long url"); got != "https://example.com/changed" {
		t.Errorf("links update --domain: long url %q", got)
	}
	if out := c.ok("stats", alias, "--domain", domain); !strings.HasPrefix(out, "link "+domain+"/"+alias+":") {
		t.Errorf("stats --domain:\n%s", out)
	}
	if list := c.ok("domains", "list"); !strings.Contains(list, domain) || !strings.HasPrefix(list, "DOMAIN") {
		t.Errorf("domains list:\n%s", list)
	}
	if r := c.run("domains", "delete", domain); r.code != exitError || !strings.Contains(r.stderr, "live links use this domain") {
		t.Errorf("domains delete with a link: %s", r)
	}
	c.ok("links", "delete", alias, "--domain", domain)
	c.ok("links", "get", alias) // the default domain's link stays
	if out := c.ok("domains", "delete", domain); out != "deleted "+domain+"\n" {
		t.Errorf("domains delete: %q", out)
	}
	if list := c.ok("domains", "list"); list != "no domains\n" {
		t.Errorf("domains list after delete: %q", list)
	}
}
