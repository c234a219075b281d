//go:build integration

package app

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"kurz.dev/services/gateway/gatewaytest"
)

// Tenant A's links are invisible to tenant B: B's reads, changes, deletes,
// stats and QR codes of A's code all answer 404 exactly like an unknown
// code, B's list does not show it, and A's link is untouched.
func TestTenantIsolation(t *testing.T) {
	gw := startGateway(t, nil)
	a, b := newTenant(t, gw, "free"), newTenant(t, gw, "free")
	ca, cb := newClient(t, gw, a.key), newClient(t, gw, b.key)
	r := ca.do("POST", "/v1/links", `{"longUrl":"https://example.com/private"}`)
	if r.code != http.StatusCreated {
		t.Fatalf("A creates: %s", r)
	}
	created := r.json(t)
	code := created["code"].(string)

	unknown := cb.do("GET", "/v1/links/zzzzzzz", "").apiError(t)["detail"]
	for _, req := range []struct{ method, path, body string }{
		{"GET", "/v1/links/" + code, ""},
		{"PATCH", "/v1/links/" + code, `{"longUrl":"https://evil.example/"}`},
		{"PATCH", "/v1/links/" + code, `{"disabled":true}`},
		{"DELETE", "/v1/links/" + code, ""},
		{"GET", "/v1/links/" + code + "/stats", ""},
		{"GET", "/v1/links/" + code + "/qr", ""},
	} {
		r := cb.do(req.method, req.path, req.body)
		e := r.apiError(t)
		if r.code != http.StatusNotFound || e["code"] != "NOT_FOUND" || e["detail"] != unknown {
			t.Errorf("B: %s %s: %s; want the 404 of an unknown code (%q)", req.method, req.path, r, unknown)
		}
	}
	if n := linkCount(t, cb); n != 0 {
		t.Errorf("B lists %d links, want 0", n)
	}
	r = ca.do("GET", "/v1/links/"+code, "")
	got := r.json(t)
	for _, f := range []string{"longUrl", "disabled", "updateTime", "tenant"} {
		if fmt.Sprint(got[f]) != fmt.Sprint(created[f]) {
			t.Errorf("A's link after B's attempts: %s = %v, want %v", f, got[f], created[f])
		}
	}
}

// A revoked key stops working on the very next request, on every gateway
// (no cache to expire); the tenant's other keys keep working.
func TestRevokedKeyStopsAtOnce(t *testing.T) {
	gw, other := startGateway(t, nil), startGateway(t, nil)
	tn := newTenant(t, gw, "free")
	admin := newClient(t, gw, adminToken)
	r := admin.do("POST", "/v1/admin/tenants/"+tn.id+"/keys", "")
	if r.code != http.StatusCreated {
		t.Fatalf("second key: %s", r)
	}
	second := r.json(t)["key"].(string)
	c, cOther := newClient(t, gw, tn.key), newClient(t, other, tn.key)
	for _, cl := range []*client{c, cOther} {
		if r := cl.do("GET", "/v1/links", ""); r.code != http.StatusOK {
			t.Fatalf("before revocation: %s", r)
		}
	}
	if r := admin.do("DELETE", "/v1/admin/tenants/"+tn.id+"/keys/"+tn.keyID, ""); r.code != http.StatusNoContent {
		t.Fatalf("revoke: %s", r)
	}
	for i, cl := range []*client{c, cOther} {
		r := cl.do("GET", "/v1/links", "")
		if e := r.apiError(t); r.code != http.StatusUnauthorized || e["detail"] != "the API key is invalid or revoked" {
			t.Errorf("gateway %d, right after revocation: %s; want 401", i, r)
		}
	}
	if r := c.with(second).do("GET", "/v1/links", ""); r.code != http.StatusOK {
		t.Errorf("the tenant's other key: %s; want 200", r)
	}
	r = admin.do("GET", "/v1/admin/tenants/"+tn.id+"/keys", "")
	if r.code != http.StatusOK || strings.Contains(string(r.body), `"key"`) ||
		!regexp.MustCompile(`"id":"`+tn.keyID+`","tenant":"`+tn.id+`","name":"test","createTime":"[^"]+","revokeTime":"[^"]+"`).Match(r.body) {
		t.Errorf("list keys: %s; want the revoked key with a revokeTime, and no key material", r)
	}
	if r := admin.do("DELETE", "/v1/admin/tenants/"+tn.id+"/keys/"+tn.keyID, ""); r.code != http.StatusNoContent {
		t.Errorf("revoking again: %s; want 204", r)
	}
	if r := admin.do("DELETE", "/v1/admin/tenants/"+tn.id+"/keys/nosuchkey123", ""); r.code != http.StatusNotFound {
		t.Errorf("revoking an unknown key: %s; want 404", r)
	}
}

// An export already streaming stops when its key is revoked: the gateway
// checks the key again before each page and aborts the response (a broken
// transfer, never a short file that looks whole). The client reads the
// header row, the key is revoked, then it reads on; its receive buffer is
// kept small, so of 3,000 big links (~24 MiB in pages of ~1 MiB) most are
// still to be read from the shortener after the revocation.
func TestRevokedKeyStopsAnExportInFlight(t *testing.T) {
	gw := startGateway(t, nil)
	tn := newBigTenant(t, gw)
	dialer := &net.Dialer{}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dialer.DialContext(ctx, network, addr)
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(64 << 10)
		}
		return conn, err
	}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequest("GET", gw.HTTP+"/v1/links:export", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tn.key)
	req.Header.Set("X-Forwarded-For", gatewaytest.NewIP())
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("export: %v", err)
	}
	defer resp.Body.Close()
	body := bufio.NewReader(resp.Body)
	if header, err := body.ReadString('\n'); resp.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("export: %d, header row %q, %v", resp.StatusCode, header, err)
	}

	admin := newClient(t, gw, adminToken)
	if r := admin.do("DELETE", "/v1/admin/tenants/"+tn.id+"/keys/"+tn.keyID, ""); r.code != http.StatusNoContent {
		t.Fatalf("revoke: %s", r)
	}
	rest, err := io.ReadAll(body)
	rows := bytes.Count(rest, []byte("\n"))
	if err == nil {
		t.Errorf("the export ran to its end after its key was revoked (%d rows, %d MiB read afterwards); want it aborted", rows, len(rest)>>20)
	}
	if rows >= bigLinks {
		t.Errorf("%d rows read after the revocation; want fewer than the tenant's %d links", rows, bigLinks)
	}
}

// The admin API: the admin token is required (a wrong one counts as a
// failed authentication), tenant IDs and plans are checked, duplicates are
// 409, keys are shown once and stored only as their SHA-256; with no admin
// token configured the admin routes do not exist.
func TestAdminAPI(t *testing.T) {
	gw := startGateway(t, nil)
	admin := newClient(t, gw, adminToken)
	if r := admin.with("").do("POST", "/v1/admin/tenants", `{"id":"x","plan":"free"}`); r.code != http.StatusUnauthorized {
		t.Errorf("no token: %s; want 401", r)
	}
	r := admin.with("wrong-token-wrong-token").do("GET", "/v1/admin/tenants/x", "")
	if r.code != http.StatusUnauthorized {
		t.Errorf("wrong token: %s; want 401", r)
	}
	if p, remaining, _ := rateLimit(t, r.header); p != "auth/per-ip" || remaining != 9 {
		t.Errorf("wrong token: RateLimit %q r=%d; want it counted by auth/per-ip (9 left)", p, remaining)
	}

	id := newTenantID(t)
	cleanupTenants(t, id)
	for _, bad := range []struct{ body, msg string }{
		{`{"id":"Bad_ID","plan":"free"}`, "id must be 1 to 63 lowercase letters"},
		{`{"id":"anonymous","plan":"free"}`, "reserved"},
		{`{"id":"` + id + `"}`, "plan is required"},
		{`{"id":"` + id + `","plan":"gold"}`, `unknown plan "gold"; known plans: `},
		{`{"id":"` + id + `","plan":"free","owner":"me"}`, `unknown field "owner"`},
		{`{"id":"` + id + `","plan":"free","name":"a\u0007b"}`, "control characters"},
		{`{"id":7,"plan":"free"}`, `field "id" must be a string, not a JSON number`},
	} {
		r := admin.do("POST", "/v1/admin/tenants", bad.body)
		if e := r.apiError(t); r.code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(e["detail"]), bad.msg) {
			t.Errorf("POST %s: %s; want 400 saying %q", bad.body, r, bad.msg)
		}
	}
	r = admin.do("POST", "/v1/admin/tenants", `{"id":"`+id+`","name":"Acme Inc.","plan":"free"}`)
	body := r.json(t)
	if r.code != http.StatusCreated || body["id"] != id || body["name"] != "Acme Inc." || body["plan"] != "free" ||
		body["createTime"] == "" || r.header.Get("Location") != "/v1/admin/tenants/"+id {
		t.Fatalf("create tenant: %s (Location %q)", r, r.header.Get("Location"))
	}
	if r := admin.do("POST", "/v1/admin/tenants", `{"id":"`+id+`","plan":"pro"}`); r.code != http.StatusConflict || r.apiError(t)["code"] != "ALREADY_EXISTS" {
		t.Errorf("duplicate tenant: %s; want 409 ALREADY_EXISTS", r)
	}
	if r := admin.do("GET", "/v1/admin/tenants/"+id, ""); r.code != http.StatusOK || r.json(t)["plan"] != "free" {
		t.Errorf("get tenant: %s", r)
	}
	if r := admin.do("GET", "/v1/admin/tenants/no-such-tenant-here", ""); r.code != http.StatusNotFound {
		t.Errorf("unknown tenant: %s; want 404", r)
	}
	if r := admin.do("POST", "/v1/admin/tenants/no-such-tenant-here/keys", ""); r.code != http.StatusNotFound {
		t.Errorf("key for an unknown tenant: %s; want 404", r)
	}

	r = admin.do("POST", "/v1/admin/tenants/"+id+"/keys", `{"name":"ci"}`)
	key, _ := r.json(t)["key"].(string)
	m := regexp.MustCompile(`^kurz_([0-9A-Za-z]{12})_([0-9A-Za-z]{32})$`).FindStringSubmatch(key)
	if r.code != http.StatusCreated || m == nil || r.json(t)["id"] != m[1] || r.header.Get("Cache-Control") != "no-store" ||
		r.header.Get("Location") != "/v1/admin/tenants/"+id+"/keys" {
		t.Fatalf("issue key: %s (Cache-Control %q, Location %q); want 201 with kurz_<12>_<32> and its id, Location the tenant's keys",
			r, r.header.Get("Cache-Control"), r.header.Get("Location"))
	}
	var stored []byte
	var leaked bool
	if err := stack.DB.QueryRow(context.Background(),
		`SELECT hash, strpos(id || tenant_id || name, $2) > 0 FROM gw_api_keys WHERE id = $1`, m[1], m[2]).Scan(&stored, &leaked); err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256([]byte(key)); string(stored) != string(sum[:]) || leaked {
		t.Errorf("stored key: hash %x (want %x), secret in a text column: %v", stored, sum, leaked)
	}
	if r := newClient(t, gw, key).do("GET", "/v1/links", ""); r.code != http.StatusOK {
		t.Errorf("the new key: %s; want 200", r)
	}

	disabled := startGateway(t, map[string]string{"KURZ_GATEWAY_ADMIN_TOKEN": ""})
	r = newClient(t, disabled, adminToken).do("POST", "/v1/admin/tenants", `{"id":"x","plan":"free"}`)
	if e := r.apiError(t); r.code != http.StatusNotFound || e["code"] != "NOT_FOUND" {
		t.Errorf("admin API disabled: %s; want 404", r)
	}
}
