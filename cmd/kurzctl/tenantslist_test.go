//go:build integration

package main

import (
	"crypto/rand"
	"strings"
	"testing"
)

// tenants list: every page with --all holds this test's tenants once each,
// --state and --plan filter, one page names the next on stderr, and -o
// json carries the API's items.
func TestTenantsList(t *testing.T) {
	gw := startGateway(t, stack.Limiter)
	c := newCtl(t, gw)
	free, pro, held := newTenantID(t), newTenantID(t), newTenantID(t)
	c.ok("tenants", "create", free, "--plan", "free", "--name", "Free Ltd")
	c.ok("tenants", "create", pro, "--plan", "pro")
	c.ok("tenants", "create", held, "--plan", "free")
	c.ok("tenants", "suspend", held, "--reason", "listing test")

	rows := func(out string) map[string][]string {
		got := map[string][]string{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
			f := strings.Fields(line)
			if _, dup := got[f[0]]; dup {
				t.Errorf("tenant %s listed twice", f[0])
			}
			got[f[0]] = f
		}
		return got
	}
	out := c.ok("tenants", "list", "--all", "--page-size", "2")
	if !strings.HasPrefix(out, "ID") {
		t.Fatalf("tenants list: no header\n%s", out)
	}
	all := rows(out)
	if f := all[free]; len(f) < 5 || f[1] != "Free" || f[3] != "free" || f[4] != "active" {
		t.Errorf("tenants list: row of %s is %q", free, f)
	}
	if f := all[held]; len(f) < 4 || f[3] != "suspended" {
		t.Errorf("tenants list: row of %s is %q", held, f)
	}
	if _, ok := all[pro]; !ok {
		t.Errorf("tenants list --all lacks %s", pro)
	}

	suspended := rows(c.ok("tenants", "list", "--all", "--state", "suspended"))
	if _, ok := suspended[held]; !ok || suspended[free] != nil || suspended[pro] != nil {
		t.Errorf("tenants list --state suspended: %v", suspended)
	}
	onPro := rows(c.ok("tenants", "list", "--all", "--plan", "pro"))
	if _, ok := onPro[pro]; !ok || onPro[free] != nil || onPro[held] != nil {
		t.Errorf("tenants list --plan pro: %v", onPro)
	}

	r := c.run("tenants", "list", "--page-size", "1")
	if r.code != 0 || !strings.Contains(r.stderr, "more tenants: --page-token ") || len(rows(r.stdout)) != 1 {
		t.Errorf("tenants list --page-size 1: %s", r)
	}
	got := decodeJSON(t, c.ok("tenants", "list", "--all", "--state", "suspended", "-o", "json"))
	var found bool
	for _, it := range got["tenants"].([]any) {
		if tn := it.(map[string]any); tn["id"] == held {
			found = tn["suspendReason"] == "listing test" && tn["state"] == "suspended"
		}
	}
	if !found || got["nextPageToken"] != "" {
		t.Errorf("tenants list -o json: %v; want %s with its reason, and no next page", got, held)
	}

	for _, args := range [][]string{{"--state", "gone"}, {"--page-size", "1001"}} {
		if r := c.run(append([]string{"tenants", "list"}, args...)...); r.code != exitUsage {
			t.Errorf("tenants list %v: %s; want a usage error", args, r)
		}
	}
	if r := c.withKey("").run("tenants", "list", "--admin-token", "wrong"); r.code != exitError {
		t.Errorf("tenants list with a wrong admin token: %s", r)
	}
}

// domains release removes a tenant's domain as the administrator: gone
// for the tenant, free for another to add and have approved; a domain the
// tenant does not hold is an error.
func TestDomainsRelease(t *testing.T) {
	gw := startGateway(t, stack.Limiter)
	admin := newCtl(t, gw)
	a, ca := tenantWithKey(t, admin, "free")
	b, cb := tenantWithKey(t, admin, "free")
	domain := "rel-" + strings.ToLower(rand.Text()[:10]) + ".acme.test"
	ca.ok("domains", "add", domain)
	admin.ok("domains", "approve", a, domain)

	if out := admin.ok("domains", "release", a, domain); out != "released "+domain+" of tenant "+a+"\n" {
		t.Errorf("domains release: %q", out)
	}
	if r := ca.run("domains", "get", domain); r.code != exitError {
		t.Errorf("the tenant's released domain: %s; want an error", r)
	}
	cb.ok("domains", "add", domain)
	if out := admin.ok("domains", "approve", b, domain); !strings.Contains(field(t, out, "verified"), "(admin)") {
		t.Errorf("approve the released domain for another tenant:\n%s", out)
	}
	if r := admin.run("domains", "release", a, domain); r.code != exitError || !strings.Contains(r.stderr, "no such domain") {
		t.Errorf("release a domain the tenant does not hold: %s", r)
	}
	if got := decodeJSON(t, admin.ok("domains", "release", b, domain, "-o", "json")); len(got) != 0 {
		t.Errorf("domains release -o json: %v", got)
	}
}

// links remove deletes a suspended tenant's link as the administrator
// (the tenant's keys are refused meanwhile); a link it does not have is
// an error.
func TestLinksRemove(t *testing.T) {
	gw := startGateway(t, stack.Limiter)
	admin := newCtl(t, gw)
	a, ca := tenantWithKey(t, admin, "free")
	code := strings.TrimSpace(ca.ok("links", "create", "https://example.com/phish", "-q"))
	admin.ok("tenants", "suspend", a, "--reason", "phishing")
	if out := admin.ok("links", "remove", a, code); out != "removed "+code+" of tenant "+a+"\n" {
		t.Errorf("links remove: %q", out)
	}
	if r := admin.run("links", "remove", a, code); r.code != exitError {
		t.Errorf("remove a link the tenant no longer has: %s; want an error", r)
	}
	admin.ok("tenants", "resume", a)
	if r := ca.run("links", "get", code); r.code != exitError {
		t.Errorf("the removed link after resume: %s; want an error", r)
	}
}
