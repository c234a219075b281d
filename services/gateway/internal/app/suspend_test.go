//go:build integration

package app

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/gateway/gatewaytest"
)

// Suspending a tenant refuses every request of its keys with 403
// TENANT_SUSPENDED (without the administrator's reason), on every gateway
// at once, while the admin routes keep working on it and another tenant
// is untouched; the shortener's tenant_suspensions lists it for the
// redirect and the webhook sender. Resuming brings back exactly what was:
// the keys work, the links are there, a link disabled before is still
// disabled.
func TestSuspendedTenantIsRefusedUntilResumed(t *testing.T) {
	gw, other := startGateway(t, nil), startGateway(t, nil)
	a, b := newTenant(t, gw, "free"), newTenant(t, gw, "free")
	admin := newClient(t, gw, adminToken)
	ca, cb, caOther := newClient(t, gw, a.key), newClient(t, gw, b.key), newClient(t, other, a.key)
	live := ca.do("POST", "/v1/links", `{"longUrl":"https://example.com/live"}`)
	off := ca.do("POST", "/v1/links", `{"longUrl":"https://example.com/off"}`)
	if live.code != http.StatusCreated || off.code != http.StatusCreated {
		t.Fatalf("creates: %s, %s", live, off)
	}
	liveCode, offCode := live.json(t)["code"].(string), off.json(t)["code"].(string)
	if r := ca.do("PATCH", "/v1/links/"+offCode, `{"disabled":true}`); r.code != http.StatusOK {
		t.Fatalf("disable: %s", r)
	}

	const reason = "phishing campaign, ticket ABUSE-12"
	r := admin.do("POST", "/v1/admin/tenants/"+a.id+"/suspend", fmt.Sprintf(`{"reason":%q}`, reason))
	if r.code != http.StatusOK {
		t.Fatalf("suspend: %s", r)
	}
	got := r.json(t)
	since, _ := got["suspendTime"].(string)
	if got["state"] != "suspended" || got["suspendReason"] != reason || since == "" {
		t.Errorf("suspend answered %s; want state suspended, the reason and a suspendTime", r)
	}
	if r := admin.do("GET", "/v1/admin/tenants/"+a.id, ""); r.json(t)["state"] != "suspended" || r.json(t)["suspendTime"] != since {
		t.Errorf("GET of the suspended tenant: %s", r)
	}
	var listed int
	if err := stack.DB.QueryRow(context.Background(), `SELECT count(*) FROM tenant_suspensions WHERE tenant = $1`, a.id).Scan(&listed); err != nil || listed != 1 {
		t.Errorf("tenant_suspensions lists the tenant %d times (%v), want once", listed, err)
	}

	for _, req := range []struct {
		c            *client
		method, path string
		body         string
	}{
		{ca, "GET", "/v1/links", ""},
		{ca, "GET", "/v1/links/" + liveCode, ""},
		{ca, "POST", "/v1/links", `{"longUrl":"https://example.com/new"}`},
		{ca, "GET", "/v1/links:export", ""},
		{ca, "GET", "/v1/webhooks", ""},
		{caOther, "GET", "/v1/links", ""},
	} {
		r := req.c.do(req.method, req.path, req.body)
		e := r.apiError(t)
		if r.code != http.StatusForbidden || e["code"] != "PERMISSION_DENIED" || e["reason"] != "TENANT_SUSPENDED" {
			t.Errorf("suspended tenant's %s %s: %s; want 403 PERMISSION_DENIED, reason TENANT_SUSPENDED", req.method, req.path, r)
		}
		if detail, _ := e["detail"].(string); strings.Contains(detail, "ABUSE") || !strings.Contains(detail, "contact the operator") {
			t.Errorf("the 403's detail %q: want the operator named and never the administrator's reason", detail)
		}
	}
	if r := cb.do("GET", "/v1/links", ""); r.code != http.StatusOK {
		t.Errorf("another tenant while the first is suspended: %s", r)
	}
	// The admin routes keep working on a suspended tenant; a key issued
	// meanwhile is refused as well.
	r = admin.do("POST", "/v1/admin/tenants/"+a.id+"/keys", "")
	if r.code != http.StatusCreated {
		t.Fatalf("issue a key to the suspended tenant: %s", r)
	}
	fresh := r.json(t)["key"].(string)
	if r := ca.with(fresh).do("GET", "/v1/links", ""); r.code != http.StatusForbidden {
		t.Errorf("a key issued while suspended: %s, want 403", r)
	}
	r = admin.do("POST", "/v1/admin/tenants/"+a.id+"/suspend", `{"reason":"amended"}`)
	if got := r.json(t); r.code != http.StatusOK || got["suspendTime"] != since || got["suspendReason"] != "amended" {
		t.Errorf("suspending again: %s; want the first suspendTime %s kept and the new reason", r, since)
	}

	for range 2 { // the second resume changes nothing
		r = admin.do("POST", "/v1/admin/tenants/"+a.id+"/resume", "")
		got := r.json(t)
		if _, has := got["suspendTime"]; r.code != http.StatusOK || got["state"] != "active" || has || got["suspendReason"] != nil {
			t.Errorf("resume: %s; want state active, no suspendTime nor reason", r)
		}
	}
	if err := stack.DB.QueryRow(context.Background(), `SELECT count(*) FROM tenant_suspensions WHERE tenant = $1`, a.id).Scan(&listed); err != nil || listed != 0 {
		t.Errorf("tenant_suspensions lists the resumed tenant %d times (%v)", listed, err)
	}
	for _, cl := range []*client{ca, caOther, ca.with(fresh)} {
		if r := cl.do("GET", "/v1/links/"+liveCode, ""); r.code != http.StatusOK || r.json(t)["disabled"] == true {
			t.Errorf("the live link after resume: %s", r)
		}
	}
	if r := ca.do("GET", "/v1/links/"+offCode, ""); r.code != http.StatusOK || r.json(t)["disabled"] != true {
		t.Errorf("the link disabled before the suspension, after resume: %s; want it still disabled", r)
	}
}

// The suspend and resume routes answer 404 for an unknown tenant, 401 to
// anything but the admin token (a tenant's own key included), and 400 for
// a missing, blank, overlong or control-character reason.
func TestSuspendRefusals(t *testing.T) {
	gw := startGateway(t, nil)
	a := newTenant(t, gw, "free")
	admin := newClient(t, gw, adminToken)
	for _, path := range []string{"/suspend", "/resume"} {
		r := admin.do("POST", "/v1/admin/tenants/no-such-tenant-gw"+path, `{"reason":"x"}`)
		if path == "/resume" {
			r = admin.do("POST", "/v1/admin/tenants/no-such-tenant-gw"+path, "")
		}
		if r.code != http.StatusNotFound {
			t.Errorf("%s of an unknown tenant: %s, want 404", path, r)
		}
		for name, cl := range map[string]*client{"the tenant's key": newClient(t, gw, a.key), "no credential": newClient(t, gw, "")} {
			if r := cl.do("POST", "/v1/admin/tenants/"+a.id+path, `{"reason":"x"}`); r.code != http.StatusUnauthorized {
				t.Errorf("%s with %s: %s, want 401", path, name, r)
			}
		}
	}
	for _, body := range []string{`{}`, `{"reason":"   "}`, fmt.Sprintf(`{"reason":%q}`, strings.Repeat("a", 501)),
		`{"reason":"a\nb"}`, `{"reason":"x","until":"tomorrow"}`, ""} {
		r := admin.do("POST", "/v1/admin/tenants/"+a.id+"/suspend", body)
		if e := r.apiError(t); r.code != http.StatusBadRequest || e["code"] != "INVALID_ARGUMENT" {
			t.Errorf("suspend with %.40q: %s, want 400", body, r)
		}
	}
	if r := newClient(t, gw, a.key).do("GET", "/v1/links", ""); r.code != http.StatusOK {
		t.Errorf("the tenant after refused suspensions: %s, want it active", r)
	}
}

// bulkAcrossSuspension sends method path with body to gw as key's client
// and suspends tenant between its headers and its body: the request asks
// "Expect: 100-continue", and the gateway says "100 Continue" only when
// its handler first reads the body, after the key was admitted, so the
// suspension comes while the upload is in progress, as it may for a body
// trickled in for minutes. It returns the final status line and body.
func bulkAcrossSuspension(t *testing.T, gw *servertest.Running, admin *client, tenant, key, method, path, contentType, body string) (string, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(gw.HTTP, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: kurz.test\r\nAuthorization: Bearer %s\r\nX-Forwarded-For: %s\r\nContent-Type: %s\r\n"+
		"Content-Length: %d\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n", method, path, key, gatewaytest.NewIP(), contentType, len(body))
	br := bufio.NewReader(conn)
	interim, err := http.ReadResponse(br, nil)
	if err != nil || interim.StatusCode != http.StatusContinue {
		t.Fatalf("%s %s before its body: %v %v; want 100 Continue", method, path, interim, err)
	}
	if r := admin.do("POST", "/v1/admin/tenants/"+tenant+"/suspend", `{"reason":"suspended during an upload"}`); r.code != http.StatusOK {
		t.Fatalf("suspend: %s", r)
	}
	if _, err := io.WriteString(conn, body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status, string(b)
}

// An import or a batch whose body was still arriving when the tenant was
// suspended makes nothing: the key is checked again before the links are
// made, as an export checks it before every page.
func TestBulkUploadInProgressMakesNothingOnceItsTenantIsSuspended(t *testing.T) {
	gw := startGateway(t, nil)
	admin := newClient(t, gw, adminToken)
	for _, tc := range []struct{ path, contentType, body string }{
		{"/v1/links:import", "text/csv", "long_url,link\nhttps://example.com/import-1,bit.ly/i1%[1]s\nhttps://example.com/import-2,bit.ly/i2%[1]s\n"},
		{"/v1/links:batch", "application/json", `{"requests":[{"longUrl":"https://example.com/batch-1"},{"longUrl":"https://example.com/batch-2"}]}`},
	} {
		a := newTenant(t, gw, "free")
		// The import keeps the file's codes: this tenant's own.
		body := strings.ReplaceAll(tc.body, "%[1]s", strings.TrimPrefix(a.id, "gwt-"))
		status, body := bulkAcrossSuspension(t, gw, admin, a.id, a.key, "POST", tc.path, tc.contentType, body)
		if !strings.HasPrefix(status, "403") || !strings.Contains(body, "TENANT_SUSPENDED") {
			t.Errorf("%s suspended during its upload: %s %s; want 403 TENANT_SUSPENDED", tc.path, status, body)
		}
		if r := admin.do("POST", "/v1/admin/tenants/"+a.id+"/resume", ""); r.code != http.StatusOK {
			t.Fatalf("resume: %s", r)
		}
		if r := newClient(t, gw, a.key).do("GET", "/v1/links", ""); r.code != http.StatusOK || len(r.json(t)["links"].([]any)) != 0 {
			t.Errorf("%s suspended during its upload made links: %s", tc.path, r)
		}
	}
}

// The administrator deletes a suspended tenant's offending link without
// resuming it (its keys, a fresh one included, are refused): the link is
// gone when the tenant resumes, another of its links is kept; an unknown
// tenant or link is 404, and a tenant's key is 401 on the route.
func TestAdminDeletesASuspendedTenantsLink(t *testing.T) {
	gw := startGateway(t, nil)
	a := newTenant(t, gw, "free")
	admin, ca := newClient(t, gw, adminToken), newClient(t, gw, a.key)
	bad := ca.do("POST", "/v1/links", `{"longUrl":"https://example.com/phish"}`)
	good := ca.do("POST", "/v1/links", `{"longUrl":"https://example.com/fine"}`)
	if bad.code != http.StatusCreated || good.code != http.StatusCreated {
		t.Fatalf("creates: %s, %s", bad, good)
	}
	badCode, goodCode := bad.json(t)["code"].(string), good.json(t)["code"].(string)
	if r := admin.do("POST", "/v1/admin/tenants/"+a.id+"/suspend", `{"reason":"phishing"}`); r.code != http.StatusOK {
		t.Fatalf("suspend: %s", r)
	}
	if r := ca.do("DELETE", "/v1/admin/tenants/"+a.id+"/links/"+badCode, ""); r.code != http.StatusUnauthorized {
		t.Errorf("the tenant's key on the admin route: %s, want 401", r)
	}
	if r := admin.do("DELETE", "/v1/admin/tenants/"+a.id+"/links/"+badCode, ""); r.code != http.StatusNoContent {
		t.Fatalf("the administrator deletes the suspended tenant's link: %s, want 204", r)
	}
	for _, path := range []string{"/v1/admin/tenants/" + a.id + "/links/" + badCode, "/v1/admin/tenants/no-such-tenant-gw/links/" + goodCode} {
		if r := admin.do("DELETE", path, ""); r.code != http.StatusNotFound {
			t.Errorf("DELETE %s: %s, want 404", path, r)
		}
	}
	if r := admin.do("POST", "/v1/admin/tenants/"+a.id+"/resume", ""); r.code != http.StatusOK {
		t.Fatalf("resume: %s", r)
	}
	if r := ca.do("GET", "/v1/links/"+badCode, ""); r.code != http.StatusNotFound {
		t.Errorf("the deleted link after resume: %s, want 404", r)
	}
	if r := ca.do("GET", "/v1/links/"+goodCode, ""); r.code != http.StatusOK {
		t.Errorf("the other link after resume: %s, want it kept", r)
	}
}

// The administrator deletes a link made without a key (tenant
// "anonymous", which has no gw_tenants row and no key that could delete
// it): DELETE /v1/admin/tenants/anonymous/links/{code} answers 204 and the
// link is deleted, on a gateway with anonymous creation on and on one with
// it off (the links made while it was on live on); the delete asked again
// is the shortener's 404. The anonymous tenant's name reaches only that
// link route: it is still no tenant to the admin API (get, keys, suspend,
// domains: 404), and a keyed tenant's link is not its own.
func TestAdminDeletesAnAnonymousLink(t *testing.T) {
	gw := startGateway(t, nil)
	closed := startGateway(t, map[string]string{"KURZ_GATEWAY_ALLOW_ANONYMOUS": "false"})
	var codes []string
	cleanupCodes(t, &codes)
	anon := newClient(t, gw, "")
	create := func(url string) string {
		t.Helper()
		r := anon.do("POST", "/v1/links", `{"longUrl":"`+url+`"}`)
		if r.code != http.StatusCreated || r.json(t)["tenant"] != "anonymous" {
			t.Fatalf("anonymous create: %s; want 201 of tenant anonymous", r)
		}
		code := r.json(t)["code"].(string)
		codes = append(codes, code)
		return code
	}
	deleted := func(code string) bool {
		t.Helper()
		var gone bool
		if err := stack.DB.QueryRow(context.Background(),
			`SELECT deleted_at IS NOT NULL FROM links WHERE tenant = 'anonymous' AND code = $1`, code).Scan(&gone); err != nil {
			t.Fatalf("read anonymous link %s: %v", code, err)
		}
		return gone
	}
	for name, g := range map[string]*servertest.Running{"anonymous creation on": gw, "anonymous creation off": closed} {
		code := create("https://example.com/phish-" + strings.ReplaceAll(name, " ", "-"))
		admin := newClient(t, g, adminToken)
		path := "/v1/admin/tenants/anonymous/links/" + code
		if r := anon.do("DELETE", path, ""); r.code != http.StatusUnauthorized || deleted(code) {
			t.Errorf("%s: the admin route without the token: %s, deleted %v; want 401, kept", name, r, deleted(code))
		}
		if r := admin.do("DELETE", path, ""); r.code != http.StatusNoContent {
			t.Fatalf("%s: the administrator deletes an anonymous link: %s, want 204", name, r)
		}
		if !deleted(code) {
			t.Errorf("%s: the anonymous link answered 204 but is not deleted", name)
		}
		if r := admin.do("DELETE", path, ""); r.code != http.StatusNotFound || r.apiError(t)["code"] != "NOT_FOUND" ||
			!strings.Contains(r.apiError(t)["detail"].(string), "no such link") {
			t.Errorf("%s: the deleted anonymous link deleted again: %s; want the shortener's 404 NOT_FOUND", name, r)
		}
	}

	admin := newClient(t, gw, adminToken)
	a := newTenant(t, gw, "free")
	keyed := newClient(t, gw, a.key).do("POST", "/v1/links", `{"longUrl":"https://example.com/keyed"}`)
	if keyed.code != http.StatusCreated {
		t.Fatalf("keyed create: %s", keyed)
	}
	for _, rq := range []struct{ method, path, body string }{
		{"DELETE", "/v1/admin/tenants/anonymous/links/" + keyed.json(t)["code"].(string), ""}, // another tenant's link
		{"GET", "/v1/admin/tenants/anonymous", ""},
		{"POST", "/v1/admin/tenants/anonymous/keys", `{"name":"x"}`},
		{"GET", "/v1/admin/tenants/anonymous/keys", ""},
		{"POST", "/v1/admin/tenants/anonymous/suspend", `{"reason":"x"}`},
		{"DELETE", "/v1/admin/tenants/anonymous/domains/go.example.com", ""},
		{"POST", "/v1/admin/tenants/anonymous/domains/go.example.com/verify", ""},
	} {
		if r := admin.do(rq.method, rq.path, rq.body); r.code != http.StatusNotFound {
			t.Errorf("%s %s: %s; want 404", rq.method, rq.path, r)
		}
	}
	if r := newClient(t, gw, a.key).do("GET", "/v1/links/"+keyed.json(t)["code"].(string), ""); r.code != http.StatusOK {
		t.Errorf("the keyed link after the anonymous route was asked to delete it: %s; want it kept", r)
	}
}

// A suspended tenant's keys stay under its rate limits: a runaway
// integration, one reason to suspend, must not gain unlimited requests
// (each a key look-up and a log line) by being suspended. A burst of 40
// on api/per-api-key (burst 5) is answered 403 up to the limit and 429
// past it (the limiter of testdata/rules.yaml, as TestPacedAndGreedyClients).
func TestSuspendedTenantsKeyStaysRateLimited(t *testing.T) {
	lim := startLimiter(t)
	gw := startGateway(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.GRPCAddr})
	a := newTenant(t, gw, "free")
	admin, c := newClient(t, gw, adminToken), newClient(t, gw, a.key)
	if r := admin.do("POST", "/v1/admin/tenants/"+a.id+"/suspend", `{"reason":"runaway integration"}`); r.code != http.StatusOK {
		t.Fatalf("suspend: %s", r)
	}
	const n = 40
	answers := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { answers[i] = c.do("GET", "/v1/links", "") })
	}
	wg.Wait()
	refused, limited := 0, 0
	for _, r := range answers {
		switch r.code {
		case http.StatusForbidden:
			refused++
		case http.StatusTooManyRequests:
			limited++
			checkTooMany(t, r, "api/per-api-key", 600, 60)
		default:
			t.Errorf("the suspended tenant's request: %s", r)
		}
	}
	if refused == 0 || limited == 0 {
		t.Errorf("a burst of %d from a suspended tenant's key: %d answered 403, %d 429; want its rate limit to hold (some of each)", n, refused, limited)
	}
}
