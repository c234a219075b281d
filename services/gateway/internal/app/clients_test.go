//go:build integration

package app

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/gateway/gatewaytest"
)

// clientsDir holds the published clients the compatibility tests drive,
// pinned by its package-lock.json, and their scripts.
const clientsDir = "testdata/clients"

// sdkStep is what a client script printed for one call: its answer, the
// error the SDK raised with the server's body, or an Error of the SDK's
// own (a body it could not read).
type sdkStep struct {
	OK     json.RawMessage `json:"ok"`
	Error  map[string]any  `json:"error"`
	Thrown string          `json:"thrown"`
	// IsBitlyErrResponse is the bitly SDK's own test of Error.
	IsBitlyErrResponse bool `json:"isBitlyErrResponse"`
}

// sdkRun is a script's output, by step name.
type sdkRun map[string]sdkStep

// ok decodes step's answer, failing the test if the call did not succeed.
func (s sdkRun) ok(t *testing.T, step string) map[string]any {
	t.Helper()
	st, found := s[step]
	if !found || st.OK == nil || st.Error != nil || st.Thrown != "" {
		t.Fatalf("%s: the SDK call failed: %+v", step, st)
	}
	var m map[string]any
	if string(st.OK) != "null" {
		if err := json.Unmarshal(st.OK, &m); err != nil {
			t.Fatalf("%s: answer %s: %v", step, st.OK, err)
		}
	}
	return m
}

// failed returns the server's error body the SDK raised for step, failing
// the test if the call succeeded or the SDK failed on its own.
func (s sdkRun) failed(t *testing.T, step string) map[string]any {
	t.Helper()
	st := s[step]
	if st.Error == nil {
		t.Fatalf("%s: want the SDK's error of the server's answer, got %+v", step, st)
	}
	return st.Error
}

// runClient runs node on a script of clientsDir, for one phase, with env
// added to the test's own, and decodes the one JSON object it prints.
// Without node or the pinned packages the test fails, saying how to
// install them.
func runClient(t *testing.T, script, phase string, env ...string) sdkRun {
	t.Helper()
	const install = "make clients installs them (npm ci in services/gateway/internal/app/testdata/clients; make test does)"
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not installed, so the published Shlink and Bitly clients cannot run: install Node 20 or later; then %s", install)
	}
	if _, err := os.Stat(filepath.Join(clientsDir, "node_modules", ".installed")); err != nil {
		t.Fatalf("the pinned clients are not installed: %s", install)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script, phase)
	cmd.Dir = clientsDir
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s: %v\n%s%s", script, err, out, stderr.String())
	}
	var run sdkRun
	if err := json.Unmarshal(out, &run); err != nil {
		t.Fatalf("node %s printed no JSON object: %v\n%s%s", script, err, out, stderr.String())
	}
	return run
}

// clientProxy is a reverse proxy in front of gw for a client script, over
// TLS when tls is set: the script's calls come from an address of their
// own (X-Forwarded-For; the test gateway trusts loopback as a proxy), so
// the failed authentications it makes on purpose count against no other
// test's address (nor loopback's, which they would soon block).
func clientProxy(t *testing.T, gw *servertest.Running, tls bool) *httptest.Server {
	t.Helper()
	target, err := url.Parse(gw.HTTP)
	if err != nil {
		t.Fatal(err)
	}
	ip := gatewaytest.NewIP()
	h := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		r.Out.Header.Set("X-Forwarded-For", ip)
	}}
	srv := httptest.NewUnstartedServer(h)
	if tls {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv
}

// kurzLink is the link of code as kurz's own API answers it.
func kurzLink(t *testing.T, c *client, code string) map[string]any {
	t.Helper()
	r := c.do("GET", "/v1/links/"+code, "")
	if r.code != http.StatusOK {
		t.Fatalf("GET /v1/links/%s: %s", code, r)
	}
	return r.json(t)
}

// Shlink's JS SDK (@shlinkio/shlink-js-sdk, as package-lock.json pins it:
// the client of shlink-web-client), with each of its HTTP clients, against
// the gateway: health, a link created with a slug, tags and a title, read,
// listed a page at a time by tag, edited, deleted; the domains listed (the
// default domain, then the tenant's verified domains only: not one it has
// not verified, nor another tenant's); the errors it raises
// for a taken slug, a missing code and a wrong key are Shlink's types, and
// kurz's documented differences (no searchTerm, no visit list, no tags)
// come as errors the SDK reads.
func TestShlinkSDK(t *testing.T) {
	gw := startGateway(t, map[string]string{"KURZ_SHORTENER_BASE_URL": shortBase})
	base, err := url.Parse(shortBase)
	if err != nil {
		t.Fatal(err)
	}
	admin := newClient(t, gw, adminToken)
	// registerDomain registers a fresh domain for the tenant of c, verified
	// by the administrator when verify is set, and returns its name.
	registerDomain := func(t *testing.T, c *client, tenantID string, verify bool) string {
		t.Helper()
		name := "sdk-" + strings.ToLower(rand.Text()[:10]) + ".acme.test"
		if r := c.do("POST", "/v1/domains", `{"name":"`+name+`"}`); r.code != http.StatusCreated {
			t.Fatalf("register %s: %s", name, r)
		}
		if verify {
			if r := admin.do("POST", "/v1/admin/tenants/"+tenantID+"/domains/"+name+"/verify", ""); r.code != http.StatusOK {
				t.Fatalf("approve %s: %s", name, r)
			}
		}
		return name
	}
	rival := newTenant(t, gw, "free")
	registerDomain(t, newClient(t, gw, rival.key), rival.id, true)
	for _, adapter := range []string{"fetch", "node"} {
		t.Run(adapter, func(t *testing.T) {
			tn := newTenant(t, gw, "free")
			c := newClient(t, gw, tn.key)
			verified := registerDomain(t, c, tn.id, true)
			registerDomain(t, c, tn.id, false)
			slug := tn.id + "-sdk"
			long := "https://example.com/shlink-sdk/" + strings.ToLower(rand.Text())
			env := []string{"KURZ_URL=" + clientProxy(t, gw, false).URL, "KURZ_KEY=" + tn.key, "KURZ_SLUG=" + slug, "KURZ_LONG=" + long, "KURZ_ADAPTER=" + adapter}
			run := runClient(t, "shlink.mjs", "make", env...)

			if h := run.ok(t, "health"); h["status"] != "pass" {
				t.Errorf("health: %v", h)
			}
			made := run.ok(t, "create")
			if made["shortCode"] != slug || made["longUrl"] != long || fmt.Sprint(made["tags"]) != "[sdk shlink]" ||
				made["title"] != "Made by the SDK" {
				t.Errorf("create: %v", made)
			}
			other, _ := run.ok(t, "createOther")["shortCode"].(string)
			if l := kurzLink(t, c, other); l["longUrl"] != long+"/other" || fmt.Sprint(l["tags"]) != "[sdk]" {
				t.Errorf("the link made without a slug, through kurz's API: %v", l)
			}
			got := run.ok(t, "get")
			if got["shortCode"] != slug || fmt.Sprint(got["visitsSummary"]) != "map[bots:0 nonBots:0 total:0]" {
				t.Errorf("get: %v", got)
			}
			// Newest first: the other link, then the slug's.
			for i, want := range []string{other, slug} {
				page := run.ok(t, fmt.Sprintf("page%d", i+1))
				data, _ := page["data"].([]any)
				p, _ := page["pagination"].(map[string]any)
				if len(data) != 1 || data[0].(map[string]any)["shortCode"] != want || p["currentPage"] != float64(i+1) {
					t.Errorf("page %d of tag sdk: %v; want %v alone", i+1, page, want)
				}
			}
			if p := run.ok(t, "page2")["pagination"]; fmt.Sprint(p) != "map[currentPage:2 itemsInCurrentPage:1 itemsPerPage:1 pagesCount:2 totalItems:2]" {
				t.Errorf("the last page's pagination: %v; want exact counts", p)
			}
			if data, _ := run.ok(t, "ordered")["data"].([]any); len(data) != 2 {
				t.Errorf("list ordered by dateCreated DESC: %d links, want 2", len(data))
			}
			edited := run.ok(t, "edit")
			if edited["longUrl"] != long+"/edited" || fmt.Sprint(edited["tags"]) != "[edited]" || edited["title"] != "Edited by the SDK" {
				t.Errorf("edit: %v", edited)
			}
			if l := kurzLink(t, c, slug); l["longUrl"] != long+"/edited" || l["title"] != "Edited by the SDK" || fmt.Sprint(l["tags"]) != "[edited]" {
				t.Errorf("the edited link through kurz's API: %v", l)
			}
			// kurz's differences (docs/api.md): refused, as the SDK reads a refusal.
			if e := run.failed(t, "search"); e["errorType"] != "INVALID_ARGUMENT" || e["status"] != float64(400) ||
				fmt.Sprint(e["invalidElements"]) != "[searchTerm]" {
				t.Errorf("list with searchTerm: %v; want Shlink's invalid-data naming searchTerm", e)
			}
			if e := run.failed(t, "visits"); e["status"] != float64(501) || e["detail"] == "" {
				t.Errorf("visits: %v; want 501 with a detail", e)
			}
			if e := run.failed(t, "tags"); e["errorType"] != "NOT_FOUND" || e["status"] != float64(404) {
				t.Errorf("tags: %v; want Shlink's not-found (kurz serves no tags)", e)
			}
			noRedirects := "map[baseUrlRedirect:<nil> invalidShortUrlRedirect:<nil> regular404Redirect:<nil>]"
			domains := run.ok(t, "domains")
			if got, want := fmt.Sprint(domains["data"]), fmt.Sprintf("[map[domain:%s isDefault:true redirects:%s] map[domain:%s isDefault:false redirects:%s]]",
				base.Host, noRedirects, verified, noRedirects); got != want || fmt.Sprint(domains["defaultRedirects"]) != noRedirects {
				t.Errorf("domains: %v\nwant data %s and defaultRedirects %s", domains, want, noRedirects)
			}
			if e := run.failed(t, "taken"); e["errorType"] != "INVALID_SLUG" || e["customSlug"] != slug {
				t.Errorf("create on a taken slug: %v; want Shlink's non-unique-slug", e)
			}

			run = runClient(t, "shlink.mjs", "remove", env...)
			run.ok(t, "delete")
			if r := c.do("GET", "/v1/links/"+slug, ""); r.code != http.StatusNotFound {
				t.Errorf("the deleted link through kurz's API: %s; want 404", r)
			}
			if e := run.failed(t, "missing"); e["errorType"] != "INVALID_SHORTCODE" || e["status"] != float64(404) || e["shortCode"] != slug {
				t.Errorf("get of a deleted code: %v; want Shlink's short-url-not-found", e)
			}
			if e := run.failed(t, "badKey"); e["errorType"] != "INVALID_API_KEY" || e["status"] != float64(401) {
				t.Errorf("a wrong key: %v; want Shlink's invalid-api-key", e)
			}
		})
	}
}

// The bitly Node SDK (bitly, as package-lock.json pins it) against the
// gateway behind TLS (the SDK speaks https only): a URL shortened (then
// again: the same bitlink), read by its id and its link, expanded,
// updated, counted, the user and groups, deleted; the errors of a deleted
// bitlink and of a wrong token are Bitly's bodies, as the SDK tells them.
func TestBitlySDK(t *testing.T) {
	gw := startGateway(t, nil)
	tn := newTenant(t, gw, "free")
	c := newClient(t, gw, tn.key)
	proxy := clientProxy(t, gw, true)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: proxy.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(strings.TrimPrefix(proxy.URL, "https://"), ":")
	long := "https://example.com/bitly-sdk/" + strings.ToLower(rand.Text())
	env := []string{"NODE_EXTRA_CA_CERTS=" + ca, "KURZ_HOST=" + host, "KURZ_PORT=" + port, "KURZ_KEY=" + tn.key, "KURZ_LONG=" + long}
	run := runClient(t, "bitly.mjs", "make", env...)

	made := run.ok(t, "shorten")
	id, _ := made["id"].(string)
	code := id[strings.LastIndex(id, "/")+1:]
	if made["long_url"] != long || made["link"] != "http://"+id {
		t.Fatalf("shorten: %v", made)
	}
	for _, step := range []string{"again", "info", "getByLink"} {
		if b := run.ok(t, step); b["id"] != id || b["long_url"] != long {
			t.Errorf("%s: %v; want bitlink %s of %s", step, b, id, long)
		}
	}
	if b := run.ok(t, "expand"); b["long_url"] != long || b["id"] != id {
		t.Errorf("expand: %v", b)
	}
	updated := run.ok(t, "update")
	if updated["long_url"] != long+"/updated" || updated["title"] != "Updated by the SDK" || fmt.Sprint(updated["tags"]) != "[sdk]" {
		t.Errorf("update: %v", updated)
	}
	if l := kurzLink(t, c, code); l["longUrl"] != long+"/updated" || l["title"] != "Updated by the SDK" || fmt.Sprint(l["tags"]) != "[sdk]" {
		t.Errorf("the updated bitlink through kurz's API: %v", l)
	}
	for _, step := range []string{"clicks", "clicksByDay"} {
		if b := run.ok(t, step); b["unit"] != "day" || b["link_clicks"] == nil {
			t.Errorf("%s: %v; want clicks per day", step, b)
		}
	}
	if b := run.ok(t, "summary"); b["total_clicks"] != float64(0) || b["units"] != float64(7) {
		t.Errorf("clicks summary: %v", b)
	}
	if u := run.ok(t, "user"); u["login"] != tn.id || u["default_group_guid"] != tn.id {
		t.Errorf("user: %v; want tenant %s", u, tn.id)
	}
	if g, _ := run.ok(t, "groups")["groups"].([]any); len(g) != 1 || g[0].(map[string]any)["guid"] != tn.id {
		t.Errorf("groups: %v; want the tenant's one", g)
	}

	run = runClient(t, "bitly.mjs", "remove", append(env, "KURZ_BITLINK="+id)...)
	if b := run.ok(t, "delete"); b["links_deleted"] == nil {
		t.Errorf("delete: %v", b)
	}
	if r := c.do("GET", "/v1/links/"+code, ""); r.code != http.StatusNotFound {
		t.Errorf("the deleted link through kurz's API: %s; want 404", r)
	}
	for step, message := range map[string]string{"missing": "NOT_FOUND", "badToken": "FORBIDDEN"} {
		if e := run.failed(t, step); e["message"] != message || !run[step].IsBitlyErrResponse {
			t.Errorf("%s: %+v; want Bitly's %s, an error body the SDK tells as one", step, run[step], message)
		}
	}
}
