//go:build integration

package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"kurz.dev/pkg/testkit/servertest"
)

// shlinkCaller calls the Shlink API as one client (its IP), its key in
// X-Api-Key as Shlink's clients send it ("" sends none), no Authorization.
type shlinkCaller struct {
	c   *client
	key string
}

func newShlinkCaller(t *testing.T, gw *servertest.Running, key string) shlinkCaller {
	return shlinkCaller{c: newClient(t, gw, ""), key: key}
}

func (s shlinkCaller) do(method, path, body string) response {
	s.c.t.Helper()
	return s.c.do(method, path, body, "X-Api-Key", s.key)
}

// shlinkProblem checks that r is a problem detail of Shlink's type kind
// (https://shlink.io/api/error/<kind>) and returns it.
func shlinkProblem(t *testing.T, r response, status int, kind string) map[string]any {
	t.Helper()
	if r.code != status {
		t.Fatalf("%s; want %d %s", r, status, kind)
	}
	p := r.apiError(t)
	if p["type"] != "https://shlink.io/api/error/"+kind {
		t.Errorf("type %v, want Shlink's %s: %s", p["type"], kind, r)
	}
	return p
}

// shlinkShortURL decodes a ShortUrl answer.
type shlinkShortURL struct {
	ShortCode     string   `json:"shortCode"`
	ShortURL      string   `json:"shortUrl"`
	LongURL       string   `json:"longUrl"`
	DateCreated   string   `json:"dateCreated"`
	Tags          []string `json:"tags"`
	VisitsSummary *struct {
		Total, NonBots, Bots int
	} `json:"visitsSummary"`
	Meta struct {
		ValidSince *string `json:"validSince"`
		ValidUntil *string `json:"validUntil"`
		MaxVisits  *int    `json:"maxVisits"`
	} `json:"meta"`
	Domain *string `json:"domain"`
	Title  *string `json:"title"`
}

func decodeShortURL(t *testing.T, r response) shlinkShortURL {
	t.Helper()
	var u shlinkShortURL
	if r.code != http.StatusOK || json.Unmarshal(r.body, &u) != nil || u.ShortCode == "" {
		t.Fatalf("want a ShortUrl: %s", r)
	}
	return u
}

// A tenant's links through Shlink's API, as shlink-web-client and scripts
// call it: created with a slug, tags, an expiry and a visit limit (200,
// Shlink's ShortUrl), read back with its visits (none yet), found in the
// list by its tag with its visits, changed, deleted; the same link through kurz's own
// API. /rest/v2 is /rest/v3.
func TestShlinkLinkLifecycle(t *testing.T) {
	gw := startGateway(t, nil)
	ten := newTenant(t, gw, "free")
	c := newShlinkCaller(t, gw, ten.key)
	slug, tag := uniqueWord(t, "sl"), uniqueWord(t, "t")

	r := c.do("POST", "/rest/v3/short-urls", fmt.Sprintf(`{"longUrl":"https://example.com/shlink","customSlug":%q,
		"tags":[%q],"validUntil":"2031-01-02T03:04:05+02:00","maxVisits":50,"title":"Shlink <script>alert(1)</script>","forwardQuery":true}`, slug, tag))
	u := decodeShortURL(t, r)
	if u.ShortCode != slug || !strings.HasSuffix(u.ShortURL, "/"+slug) || u.LongURL != "https://example.com/shlink" ||
		!slices.Equal(u.Tags, []string{tag}) || u.Meta.ValidUntil == nil || *u.Meta.ValidUntil != "2031-01-02T01:04:05+00:00" ||
		u.Meta.MaxVisits == nil || *u.Meta.MaxVisits != 50 || u.Domain != nil || u.Title == nil || *u.Title != "Shlink <script>alert(1)</script>" || u.VisitsSummary == nil {
		t.Errorf("create: %s", r.body)
	}
	if r.header.Get("Cache-Control") != "no-store" {
		t.Errorf("create answered Cache-Control %q, want no-store", r.header.Get("Cache-Control"))
	}
	if got := newClient(t, gw, ten.key).do("GET", "/v1/links/"+slug, "").json(t); got["longUrl"] != "https://example.com/shlink" || got["maxVisits"] != "50" {
		t.Errorf("GET /v1/links/%s: %v, want the link made through Shlink's API", slug, got)
	}

	r = c.do("GET", "/rest/v2/short-urls/"+slug, "")
	if u := decodeShortURL(t, r); u.VisitsSummary == nil || u.VisitsSummary.Total != 0 || u.DateCreated == "" {
		t.Errorf("GET through v2: %s; want the link with its visitsSummary", r.body)
	}

	r = c.do("GET", "/rest/v3/short-urls?tags[]="+tag, "")
	var list struct {
		ShortURLs struct {
			Data       []shlinkShortURL `json:"data"`
			Pagination map[string]int   `json:"pagination"`
		} `json:"shortUrls"`
	}
	if err := json.Unmarshal(r.body, &list); err != nil || r.code != http.StatusOK || len(list.ShortURLs.Data) != 1 ||
		list.ShortURLs.Data[0].ShortCode != slug || list.ShortURLs.Pagination["totalItems"] != 1 || list.ShortURLs.Pagination["pagesCount"] != 1 {
		t.Errorf("list by tag: %s", r)
	} else if v := list.ShortURLs.Data[0].VisitsSummary; v == nil || v.Total != 0 {
		t.Errorf("list by tag: %s; want the link with its visitsSummary, no visits", r.body)
	}

	r = c.do("PATCH", "/rest/v3/short-urls/"+slug, `{"longUrl":"https://example.com/moved","maxVisits":null,"tags":[]}`)
	if u := decodeShortURL(t, r); u.LongURL != "https://example.com/moved" || u.Meta.MaxVisits != nil || len(u.Tags) != 0 ||
		u.Title == nil || *u.Title != "Shlink <script>alert(1)</script>" {
		t.Errorf("PATCH without a title: %s; want the changes, the title kept", r.body)
	}
	r = c.do("PATCH", "/rest/v3/short-urls/"+slug, `{"title":"Renamed"}`)
	if u := decodeShortURL(t, r); u.Title == nil || *u.Title != "Renamed" {
		t.Errorf("PATCH of the title: %s", r.body)
	}
	if got := newClient(t, gw, ten.key).do("GET", "/v1/links/"+slug, "").json(t); got["title"] != "Renamed" {
		t.Errorf("GET /v1/links/%s after Shlink's PATCH: %v; want title Renamed", slug, got)
	}
	p := shlinkProblem(t, c.do("PATCH", "/rest/v3/short-urls/"+slug, `{"title":"`+strings.Repeat("x", 513)+`"}`), http.StatusBadRequest, "invalid-data")
	if fmt.Sprint(p["invalidElements"]) != "[title]" {
		t.Errorf("PATCH of a title of 513 characters: %v; want invalid-data naming title", p)
	}
	r = c.do("PATCH", "/rest/v3/short-urls/"+slug, `{"title":null}`)
	if u := decodeShortURL(t, r); u.Title != nil {
		t.Errorf("PATCH of title null: %s; want the title cleared, answered null", r.body)
	}

	if r = c.do("DELETE", "/rest/v3/short-urls/"+slug, ""); r.code != http.StatusNoContent {
		t.Errorf("DELETE: %s", r)
	}
	p = shlinkProblem(t, c.do("GET", "/rest/v3/short-urls/"+slug, ""), http.StatusNotFound, "short-url-not-found")
	if p["shortCode"] != slug {
		t.Errorf("GET of the deleted link: %v; want short-url-not-found naming %s", p, slug)
	}
}

// Another tenant's link is not found by any Shlink call, nor listed, nor
// changed, nor deleted; a slug another tenant holds is Shlink's
// non-unique-slug, as is the caller's own slug sent again without
// findIfExists; findIfExists answers the link of the URL it made before.
func TestShlinkSeesOnlyTheTenantsLinks(t *testing.T) {
	gw := startGateway(t, nil)
	a, b := newTenant(t, gw, "free"), newTenant(t, gw, "free")
	ca := newShlinkCaller(t, gw, a.key)
	cb := newShlinkCaller(t, gw, b.key)
	slug := uniqueWord(t, "own")
	long := "https://example.com/own/" + slug
	if r := ca.do("POST", "/rest/v3/short-urls", fmt.Sprintf(`{"longUrl":%q,"customSlug":%q}`, long, slug)); r.code != http.StatusOK {
		t.Fatalf("create: %s", r)
	}

	for _, tc := range []struct{ method, body string }{{"GET", ""}, {"PATCH", `{"longUrl":"https://evil.example/"}`}, {"DELETE", ""}} {
		r := cb.do(tc.method, "/rest/v3/short-urls/"+slug, tc.body)
		if shlinkProblem(t, r, http.StatusNotFound, "short-url-not-found"); strings.Contains(string(r.body), long) {
			t.Errorf("%s of another tenant's link: %s carries its URL", tc.method, r)
		}
	}
	if r := cb.do("GET", "/rest/v3/short-urls?itemsPerPage=1000", ""); r.code != http.StatusOK || strings.Contains(string(r.body), slug) {
		t.Errorf("another tenant's list: %s; want it without %s", r, slug)
	}
	if u := decodeShortURL(t, ca.do("GET", "/rest/v3/short-urls/"+slug, "")); u.LongURL != long {
		t.Errorf("the owner's link changed to %s", u.LongURL)
	}

	p := shlinkProblem(t, cb.do("POST", "/rest/v3/short-urls", fmt.Sprintf(`{"longUrl":"https://example.com/b","customSlug":%q}`, slug)),
		http.StatusBadRequest, "non-unique-slug")
	if p["customSlug"] != slug {
		t.Errorf("another tenant's slug: %v", p)
	}
	shlinkProblem(t, ca.do("POST", "/rest/v3/short-urls", fmt.Sprintf(`{"longUrl":%q,"customSlug":%q}`, long, slug)),
		http.StatusBadRequest, "non-unique-slug")
	if u := decodeShortURL(t, ca.do("POST", "/rest/v3/short-urls", fmt.Sprintf(`{"longUrl":%q,"customSlug":%q,"findIfExists":true}`, long, slug))); u.ShortCode != slug {
		t.Errorf("findIfExists with the caller's slug: %s, want %s", u.ShortCode, slug)
	}

	found := fmt.Sprintf(`{"longUrl":"https://example.com/find/%s","findIfExists":true}`, slug)
	first := decodeShortURL(t, ca.do("POST", "/rest/v3/short-urls", found))
	if again := decodeShortURL(t, ca.do("POST", "/rest/v3/short-urls", found)); again.ShortCode != first.ShortCode || again.VisitsSummary == nil {
		t.Errorf("findIfExists again: %s, want %s with its visits", again.ShortCode, first.ShortCode)
	}
	if other := decodeShortURL(t, cb.do("POST", "/rest/v3/short-urls", found)); other.ShortCode == first.ShortCode {
		t.Errorf("another tenant's findIfExists found %s, the first tenant's link", other.ShortCode)
	}
}

// The Shlink API takes a kurz key in X-Api-Key only, with the key checks
// of every route: none is Shlink's missing-authentication, a wrong one
// invalid-api-key; a suspended tenant's is kurz's 403, charged to its
// quota; GET /rest/health answers without a key; the visits are refused
// (501), not answered empty.
func TestShlinkKeysHealthAndVisits(t *testing.T) {
	gw := startGateway(t, nil)
	ten := newTenant(t, gw, "free")
	c := newShlinkCaller(t, gw, ten.key)

	p := shlinkProblem(t, shlinkCaller{c: c.c}.do("GET", "/rest/v3/short-urls", ""), http.StatusUnauthorized, "missing-authentication")
	if fmt.Sprint(p["expectedHeaders"]) != "[X-Api-Key]" {
		t.Errorf("no key: %v", p)
	}
	shlinkProblem(t, shlinkCaller{c.c, "kurz_nokey_0123456789abcdef0123456789abcdef"}.do("GET", "/rest/v3/short-urls", ""),
		http.StatusUnauthorized, "invalid-api-key")
	r := newClient(t, gw, ten.key).do("GET", "/rest/v3/short-urls", "")
	shlinkProblem(t, r, http.StatusUnauthorized, "missing-authentication")

	r = c.do("GET", "/rest/v3/short-urls/abcd123/visits", "")
	if p := r.apiError(t); r.code != http.StatusNotImplemented || p["type"] != "https://kurz.dev/problems/unimplemented" {
		t.Errorf("visits: %s; want 501", r)
	}

	r = newClient(t, gw, "").do("GET", "/rest/health", "")
	if m := r.json(t); r.code != http.StatusOK || r.header.Get("Content-Type") != "application/health+json" || m["status"] != "pass" {
		t.Errorf("health: %s %s", r, r.header.Get("Content-Type"))
	}

	admin := newClient(t, gw, adminToken)
	if r := admin.do("POST", "/v1/admin/tenants/"+ten.id+"/suspend", `{"reason":"shlink test"}`); r.code != http.StatusOK {
		t.Fatalf("suspend: %s", r)
	}
	r = c.do("POST", "/rest/v3/short-urls", `{"longUrl":"https://example.com/suspended"}`)
	if p := r.apiError(t); r.code != http.StatusForbidden || p["reason"] != "TENANT_SUSPENDED" || r.header.Get("RateLimit") == "" {
		t.Errorf("suspended tenant: %s, RateLimit %q; want 403 TENANT_SUSPENDED charged to its quota", r, r.header.Get("RateLimit"))
	}
}

// Each Shlink call counts against the edge quota as the kurz route it
// mirrors: a rule on POST /v1/links alone (two creates an hour) holds
// whichever API creates, a Shlink create included, and its refusals:
// after two creates through kurz's own API, Shlink's create is refused
// by that rule, with a bad body as with a good one, while Shlink's list,
// another route, passes.
func TestShlinkCallsCountAsTheKurzRouteTheyMirror(t *testing.T) {
	gw := gatewayWithAPIRule(t, `{name: creates, key: [api_key], match: {route: "POST /v1/links"}, algorithm: token_bucket, limit: 2, window: 1h, burst: 2, failure_mode: open}`)
	ten := newTenant(t, gw, "free")
	kurz := newClient(t, gw, ten.key)
	c := shlinkCaller{kurz, ten.key}

	for i := range 2 {
		if r := kurz.do("POST", "/v1/links", fmt.Sprintf(`{"longUrl":"https://example.com/quota/%d"}`, i)); r.code != http.StatusCreated {
			t.Fatalf("create %d through kurz's API: %s", i, r)
		}
	}
	for _, body := range []string{`{"longUrl":"https://example.com/quota/shlink"}`, `{"longUrl": 7}`} {
		r := c.do("POST", "/rest/v3/short-urls", body)
		if p, _, _ := ratePolicy(t, r.header); r.code != http.StatusTooManyRequests || p != "api/creates" {
			t.Errorf("Shlink create %s after two kurz creates: %s, policy %q; want 429 by api/creates", body, r, p)
		}
	}
	if r := c.do("GET", "/rest/v3/short-urls", ""); r.code != http.StatusOK {
		t.Errorf("Shlink list: %s; want it counted as GET /v1/links, not refused", r)
	}
}
