package rulestore

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
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
	for _, domain := range []string{"demo", "demo.race", "api", "links.create", "redirect.miss", "links.password", "links.password.guesses", "clicks", "auth"} {
		if _, ok := cfg.Domains[domain]; !ok {
			t.Errorf("bootstrap lacks domain %s", domain)
		}
	}
}

// Password attempts are bounded per address over all links, not only per
// address and link: each attempt costs an Argon2 check, and one key holder
// can make many password links. The rule is enforced and fails closed.
func TestBootstrapBoundsPasswordAttemptsPerAddress(t *testing.T) {
	cfg, err := Parse(Bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := ratelimit.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, applied := rules.Match("links.password", map[string]string{"ip": "198.51.100.7", "code": "any"})
	for _, a := range applied {
		if a.Rule.Shadow || a.Rule.FailureMode != ratelimitv1.FailureMode_FAILURE_MODE_CLOSED || len(a.Rule.Key) != 1 || a.Rule.Key[0] != "ip" {
			continue
		}
		if a.Rule.Limit > 1000 {
			t.Errorf("links.password/%s allows %d attempts per address: no bound on Argon2 work", a.Rule.Name, a.Rule.Limit)
		}
		return
	}
	t.Error("links.password has no enforced, fail-closed rule keyed on ip alone")
}

// Every anonymous caller shares tenant "anonymous": its per-tenant rules
// must outlast many addresses at their per-address allowance (two
// addresses at 60 a minute took the whole refill of links.create's 120),
// in the long run (20 of them) and in a burst (10 at once).
func TestBootstrapAnonymousTenantOutlastsManyAddresses(t *testing.T) {
	cfg, err := Parse(Bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := ratelimit.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const addresses, atOnce = 20, 10
	for _, domain := range []string{"api", "links.create"} {
		_, applied := rules.Match(domain, map[string]string{"tenant": "anonymous", "ip": "198.51.100.7", "route": "POST /v1/links"})
		var perIP, perTenant *ratelimit.Rule
		for _, a := range applied {
			switch {
			case slices.Equal(a.Rule.Key, []string{"ip"}):
				perIP = a.Rule
			case slices.Equal(a.Rule.Key, []string{"tenant"}):
				perTenant = a.Rule
			}
		}
		if perIP == nil || perTenant == nil {
			t.Errorf("%s: anonymous creation is not subject to a per-ip and a per-tenant rule", domain)
			continue
		}
		rate := func(r *ratelimit.Rule) float64 { return float64(r.Limit) / r.Window.Seconds() }
		if rate(perTenant) < addresses*rate(perIP) || capacity(perTenant) < atOnce*capacity(perIP) {
			t.Errorf("%s: the anonymous tenant's %s (%d per %v, capacity %d) is taken by fewer than %d addresses at %s's %d per %v, or %d at its capacity %d",
				domain, perTenant.Name, perTenant.Limit, perTenant.Window, capacity(perTenant), addresses, perIP.Name, perIP.Limit, perIP.Window, atOnce, capacity(perIP))
		}
	}
}

// capacity is the most r holds at once: its burst, else its limit.
func capacity(r *ratelimit.Rule) int64 {
	if r.Burst > 0 {
		return r.Burst
	}
	return r.Limit
}

func TestChangesNamesTenantsUpToABound(t *testing.T) {
	c := NewChanges()
	c.Note("rl_tenant_plans:a:b") // tenant IDs may hold colons
	c.Note("rl_tenant_plans:c")
	c.Note("rl_tenant_plans:c")
	rules, all, tenants := c.take()
	slices.Sort(tenants)
	if rules || all || !slices.Equal(tenants, []string{"a:b", "c"}) {
		t.Errorf("two tenants named: rules %v, all %v, tenants %q; want only a:b and c", rules, all, tenants)
	}
	c.Note("rl_plans")
	if rules, all, tenants = c.take(); !rules || all || len(tenants) > 0 {
		t.Errorf("rl_plans: rules %v, all %v, tenants %q; want the rules only", rules, all, tenants)
	}
	for i := range maxNamedTenants + 1 {
		c.Note(fmt.Sprintf("rl_tenant_plans:t%d", i))
	}
	if rules, all, tenants = c.take(); rules || !all || len(tenants) > 0 {
		t.Errorf("%d tenants named: rules %v, all %v, %d tenants; want every tenant", maxNamedTenants+1, rules, all, len(tenants))
	}
	c.Note("rl_tenant_plans")
	if _, all, _ = c.take(); !all {
		t.Error("rl_tenant_plans alone did not mean every tenant")
	}
	if rules, all, tenants = c.take(); rules || all || len(tenants) > 0 {
		t.Errorf("take did not forget: rules %v, all %v, tenants %q", rules, all, tenants)
	}
}

// A plan's limit or burst of 0 would keep the rule's own figure (more
// quota, where it reads as none): refused, with what to write instead.
func TestParseRefusesAPlanFigureOfZero(t *testing.T) {
	const rules = `
domains:
  api: {rules: [{name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}]}
plans:
  free: {api/a: {%s}}
`
	for figure, why := range map[string]string{
		"limit: 0": "would keep the rule's own", "burst: 0": "would keep the rule's own", "limit: 0.0": "would keep the rule's own",
		"limit: 0.5": "want a whole number", "burst: 0.3": "want a whole number", "limit: 1.9": "want a whole number",
	} {
		_, err := Parse(fmt.Appendf(nil, rules, figure))
		if err == nil || !strings.Contains(err.Error(), "plan free, rule api/a") || !strings.Contains(err.Error(), why) {
			t.Errorf("plan figure %q: %v; want it refused (%s), naming the plan and rule", figure, err, why)
		}
	}
	for _, figure := range []string{"limit: 5", "burst: 3", "window: 1m"} {
		if _, err := Parse(fmt.Appendf(nil, rules, figure)); err != nil {
			t.Errorf("plan figure %q: %v; want it accepted", figure, err)
		}
	}
}
