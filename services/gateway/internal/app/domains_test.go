//go:build integration

package app

import (
	"crypto/rand"
	"encoding/csv"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// Custom domains through the REST API, on the real stack: two tenants, a
// domain claimed by both, verified by one (the other's claim goes), by the
// administrator, a link on it beside the same code on the default domain,
// the other tenant kept off the domain and its links, and the domain in
// the link, its export and its statistics.
func TestCustomDomainsREST(t *testing.T) {
	gw := startGateway(t, nil)
	a, b := newTenant(t, gw, "free"), newTenant(t, gw, "free")
	ca, cb, admin := newClient(t, gw, a.key), newClient(t, gw, b.key), newClient(t, gw, adminToken)
	domain := "go-" + strings.ToLower(rand.Text()[:10]) + ".acme.test"

	r := ca.do("POST", "/v1/domains", `{"name":"`+strings.ToUpper(domain)+`"}`)
	if r.code != http.StatusCreated || r.header.Get("Location") != "/v1/domains/"+domain {
		t.Fatalf("register: %s (Location %q)", r, r.header.Get("Location"))
	}
	d := r.json(t)
	if again := ca.do("POST", "/v1/domains", `{"name":"`+domain+`"}`); again.code != http.StatusOK ||
		again.header.Get("Location") != "/v1/domains/"+domain || again.json(t)["verificationToken"] != d["verificationToken"] {
		t.Errorf("register it again: %s; want 200 with the same domain", again)
	}
	if d["name"] != domain || d["verified"] == true || d["verificationRecord"] != "_kurz-challenge."+domain ||
		!strings.HasPrefix(d["verificationToken"].(string), "kurz-verify=") {
		t.Fatalf("registered: %v", d)
	}
	if r := admin.do("POST", "/v1/admin/tenants/"+b.id+"/domains/"+domain+"/verify", ""); r.code != http.StatusNotFound {
		t.Errorf("approve A's domain as B's: %s; want 404", r)
	}
	// Unverified, the name is only A's claim: B may claim it too.
	if r := cb.do("POST", "/v1/domains", `{"name":"`+domain+`"}`); r.code != http.StatusCreated || r.json(t)["verificationToken"] == d["verificationToken"] {
		t.Errorf("B claims A's unverified domain: %s; want 201 with a token of its own", r)
	}
	if r := ca.do("POST", "/v1/domains", `{"name":"127.0.0.1"}`); r.code != http.StatusBadRequest {
		t.Errorf("register an IP: %s; want 400", r)
	}
	// No outside DNS here: the lookup fails, and says so.
	if r := ca.do("POST", "/v1/domains/"+domain+"/verify", ""); r.code != http.StatusServiceUnavailable || r.apiError(t)["reason"] != "DNS_UNAVAILABLE" {
		t.Errorf("verify without DNS: %s; want 503 DNS_UNAVAILABLE", r)
	}
	if r := ca.do("POST", "/v1/links", `{"longUrl":"https://example.com/x","domain":"`+domain+`"}`); r.code != http.StatusBadRequest {
		t.Errorf("link on an unverified domain: %s; want 400", r)
	}
	r = admin.do("POST", "/v1/admin/tenants/"+a.id+"/domains/"+domain+"/verify", "")
	if v := r.json(t); r.code != http.StatusOK || v["verified"] != true || v["verifiedBy"] != "admin" {
		t.Fatalf("approve: %s", r)
	}
	// Verified by A: B's claim is gone, and the name is refused to B.
	if r := cb.do("POST", "/v1/domains", `{"name":"`+domain+`"}`); r.code != http.StatusConflict || strings.Contains(r.String(), a.id) {
		t.Errorf("B registers A's verified domain: %s; want 409 naming no tenant", r)
	}

	alias := "d" + strings.ToLower(rand.Text()[:8])
	r = ca.do("POST", "/v1/links", `{"longUrl":"https://example.com/custom","customAlias":"`+alias+`","domain":"`+domain+`"}`)
	if l := r.json(t); r.code != http.StatusCreated || l["domain"] != domain || l["shortUrl"] != "https://"+domain+"/"+alias ||
		r.header.Get("Location") != "/v1/links/"+alias+"?domain="+domain {
		t.Fatalf("link on the domain: %s (Location %q)", r, r.header.Get("Location"))
	}
	r = ca.do("POST", "/v1/links", `{"longUrl":"https://example.com/default","customAlias":"`+alias+`"}`)
	if l := r.json(t); r.code != http.StatusCreated || l["domain"] != nil || !strings.HasSuffix(l["shortUrl"].(string), "/"+alias) {
		t.Fatalf("the same code on the default domain: %s", r)
	}
	if r := ca.do("GET", "/v1/links/"+alias+"?domain="+domain, ""); r.code != http.StatusOK || r.json(t)["longUrl"] != "https://example.com/custom" {
		t.Errorf("get on the domain: %s", r)
	}
	if r := ca.do("GET", "/v1/links/"+alias, ""); r.code != http.StatusOK || r.json(t)["longUrl"] != "https://example.com/default" {
		t.Errorf("get on the default domain: %s", r)
	}
	r = ca.do("PATCH", "/v1/links/"+alias, `{"domain":"`+domain+`","longUrl":"https://example.com/changed"}`)
	if r.code != http.StatusOK || r.json(t)["longUrl"] != "https://example.com/changed" || r.json(t)["domain"] != domain {
		t.Errorf("patch on the domain: %s", r)
	}

	// B can neither use the domain nor reach A's link on it.
	if r := cb.do("POST", "/v1/links", `{"longUrl":"https://example.com/x","domain":"`+domain+`"}`); r.code != http.StatusBadRequest {
		t.Errorf("B's link on A's domain: %s; want 400", r)
	}
	for _, p := range []string{"/v1/links/" + alias + "?domain=" + domain, "/v1/links/" + alias + "/stats?domain=" + domain, "/v1/domains/" + domain} {
		if r := cb.do("GET", p, ""); r.code != http.StatusNotFound {
			t.Errorf("B: GET %s: %s; want 404", p, r)
		}
	}
	if r := cb.do("GET", "/v1/domains", ""); r.code != http.StatusOK || len(r.json(t)["domains"].([]any)) != 0 {
		t.Errorf("B lists domains: %s; want none", r)
	}
	if r := ca.do("GET", "/v1/domains", ""); r.code != http.StatusOK || len(r.json(t)["domains"].([]any)) != 1 {
		t.Errorf("A lists domains: %s; want one", r)
	}

	// Statistics and the export carry the domain.
	r = ca.do("GET", "/v1/links/"+alias+"/stats?domain="+domain, "")
	if s := r.json(t); r.code != http.StatusOK || s["domain"] != domain || s["code"] != alias {
		t.Errorf("stats on the domain: %s", r)
	}
	r = ca.do("GET", "/v1/links:export", "")
	recs, err := csv.NewReader(strings.NewReader(string(r.body))).ReadAll()
	if err != nil || r.code != http.StatusOK {
		t.Fatalf("export: %v %s", err, r)
	}
	col := slices.Index(recs[0], "domain")
	var domains []string
	for _, rec := range recs[1:] {
		if rec[0] == alias {
			domains = append(domains, rec[col])
		}
	}
	slices.Sort(domains)
	if col < 0 || !slices.Equal(domains, []string{"", domain}) {
		t.Errorf("export: the rows of %s have domains %q, want the default and %s", alias, domains, domain)
	}

	// The domain goes only once its links have.
	if r := ca.do("DELETE", "/v1/domains/"+domain, ""); r.code != http.StatusBadRequest || r.apiError(t)["reason"] != "DOMAIN_IN_USE" {
		t.Errorf("delete a domain with links: %s; want 400 DOMAIN_IN_USE", r)
	}
	if r := ca.do("DELETE", "/v1/links/"+alias+"?domain="+domain, ""); r.code != http.StatusNoContent {
		t.Fatalf("delete the link on the domain: %s", r)
	}
	if r := ca.do("GET", "/v1/links/"+alias, ""); r.code != http.StatusOK {
		t.Errorf("the default domain's link after the other's deletion: %s", r)
	}
	if r := ca.do("DELETE", "/v1/domains/"+domain, ""); r.code != http.StatusNoContent {
		t.Errorf("delete the domain: %s", r)
	}
}
