//go:build integration

package app

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

// One tenant's traffic cannot consume another tenant's quota, however the
// tenant names are crafted: for each pair, tenant a spends its whole
// per-tenant limit (3 per hour) and is denied, and tenant b's first request
// is then allowed with its own full quota (per-tenant 2 of 3 left, per-key 4
// of 5). Pairs cover plain names and names built to collide once joined with
// ':' into a key, or to move the {hash tag}: in domain quota each rule's key
// is its own hash tag, in quota.tenant both rules live under the tenant's tag
// {t:<tenant>}, which must hold the whole tenant, escaped, and nothing else,
// so a's two rules stay in one slot and no name reaches another tenant's.
func TestTenantCannotConsumeAnotherTenantsQuota(t *testing.T) {
	_, rl := startFile(t)
	ctx := context.Background()
	type party struct{ tenant, key string }
	// Built per subtest from a fresh, short u (values over 64 bytes would be
	// hashed, and this test is about escaping).
	pairs := map[string]func(u string) (a, b party){
		"two tenants": func(u string) (party, party) { return party{u + "-a", u + "-x"}, party{u + "-b", u + "-y"} },
		// Joined with ':', both read u:k:u.
		"colon moves into the key":    func(u string) (party, party) { return party{u + ":k", u}, party{u, "k:" + u} },
		"colon moves into the tenant": func(u string) (party, party) { return party{u, "k:" + u}, party{u + ":k", u} },
		"closing brace ends the tag":  func(u string) (party, party) { return party{u + "}:k", u + "-x"}, party{u, u + "-y"} },
		"braces around the tenant":    func(u string) (party, party) { return party{"{" + u + "}", u + "-x"}, party{u, u + "-y"} },
		"brace vs its escape":         func(u string) (party, party) { return party{u + "}", u + "-x"}, party{u + "%7D", u + "-y"} },
		"tag of another tenant": func(u string) (party, party) {
			return party{u + "}:{t:" + u + "-v", u + "-x"}, party{u + "-v", u + "-y"}
		},
	}
	for _, domain := range []string{"quota", "quota.tenant"} {
		for name, pair := range pairs {
			t.Run(domain+"/"+name, func(t *testing.T) {
				p := struct{ a, b party }{}
				p.a, p.b = pair(fmt.Sprintf("iso%x", time.Now().UnixNano()))
				desc := func(pt party) map[string]string {
					return map[string]string{"tenant": pt.tenant, "api_key": pt.key}
				}
				check := func(pt party) *ratelimitv1.CheckQuotaResponse {
					t.Helper()
					resp, err := rl.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: domain, Descriptors: desc(pt)})
					if err != nil {
						t.Fatalf("CheckQuota(%q): %v", desc(pt), err)
					}
					if resp.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
						t.Fatalf("CheckQuota(%q): source %v, want REDIS", desc(pt), resp.GetSource())
					}
					return resp
				}
				for i := range 3 {
					if resp := check(p.a); !resp.GetAllowed() {
						t.Fatalf("tenant a, request %d: denied by %s, want allowed (3 per hour)", i+1, resp.GetDecidingRule())
					}
				}
				if resp := check(p.a); resp.GetAllowed() || resp.GetDecidingRule() != "per-tenant" {
					t.Fatalf("tenant a, request 4: allowed=%v by %q, want denied by per-tenant", resp.GetAllowed(), resp.GetDecidingRule())
				}
				resp := check(p.b)
				if !resp.GetAllowed() || decisionOf(t, resp, "per-tenant").GetRemaining() != 2 || decisionOf(t, resp, "per-key").GetRemaining() != 4 {
					t.Errorf("tenant b (%q) after a (%q) spent its quota: allowed=%v, per-tenant %d left, per-key %d left; want allowed with 2 and 4 left",
						desc(p.b), desc(p.a), resp.GetAllowed(), decisionOf(t, resp, "per-tenant").GetRemaining(), decisionOf(t, resp, "per-key").GetRemaining())
				}

				seen := map[string]string{}
				for who, pt := range map[string]party{"a": p.a, "b": p.b} {
					ex, err := rl.ExplainQuota(ctx, &ratelimitv1.ExplainQuotaRequest{Domain: domain, Descriptors: desc(pt)})
					if err != nil {
						t.Fatal(err)
					}
					tags := map[string]bool{}
					for _, r := range ex.GetRules() {
						for _, k := range r.GetKeys() {
							if other, dup := seen[k]; dup {
								t.Errorf("key %q is used by tenant %s and tenant %s", k, other, who)
							}
							seen[k] = who
							if !strings.HasPrefix(k, "rl:{") || strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
								t.Errorf("tenant %s: key %q, want rl:{...} with no other brace", who, k)
								continue
							}
							tag := k[len("rl:{"):strings.IndexByte(k, '}')]
							tags[tag] = true
							if domain == "quota.tenant" && (!strings.HasPrefix(tag, "t:") || strings.ContainsAny(tag[2:], ":{}")) {
								t.Errorf("tenant %s: hash tag %q of key %q, want t:<escaped tenant>", who, tag, k)
							}
						}
					}
					if domain == "quota.tenant" && len(tags) != 1 {
						t.Errorf("tenant %s: its rules sit under %d hash tags %v, want one (one slot, one script)", who, len(tags), tags)
					}
				}
			})
		}
	}
}
