//go:build integration

package app

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// bitlyLink decodes a bitlink answer of status.
func bitlyLink(t *testing.T, r response, status int) map[string]any {
	t.Helper()
	if r.code != status {
		t.Fatalf("%s; want %d and a bitlink", r, status)
	}
	b := r.json(t)
	if id, _ := b["id"].(string); !strings.Contains(id, "/") || b["link"] != "http://"+id {
		t.Fatalf("not a bitlink of an http short URL: %s", r)
	}
	return b
}

// bitlyError checks that r is Bitly's error body of status and message.
func bitlyError(t *testing.T, r response, status int, message string) map[string]any {
	t.Helper()
	if r.code != status || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("%s (%s); want Bitly's %d %s", r, r.header.Get("Content-Type"), status, message)
	}
	e := r.json(t)
	if e["message"] != message || e["description"] == "" || e["request_id"] != r.header.Get("X-Request-ID") {
		t.Errorf("%s; want message %s, a description and the request ID", r, message)
	}
	return e
}

// A tenant's links through Bitly's API, as its SDKs call it: shortened
// (201, then 200 for the same URL), created with tags, read by its id in
// both path forms, changed, expanded, counted, listed in the tenant's one
// group a page at a time, deleted; the user and group are the tenant.
func TestBitlyLinkLifecycle(t *testing.T) {
	gw := startGateway(t, nil)
	tn := newTenant(t, gw, "free")
	c := newClient(t, gw, tn.key)
	long := "https://example.com/bitly/" + strings.ToLower(rand.Text())

	first := bitlyLink(t, c.do("POST", "/v4/shorten", fmt.Sprintf(`{"long_url":%q,"domain":"bit.ly"}`, long)), http.StatusCreated)
	again := bitlyLink(t, c.do("POST", "/v4/shorten", fmt.Sprintf(`{"long_url":%q,"group_guid":%q}`, long, tn.id)), http.StatusOK)
	if again["id"] != first["id"] || first["long_url"] != long || first["archived"] != false {
		t.Errorf("shortened twice: %v then %v; want one bitlink of the URL", first, again)
	}
	id := first["id"].(string)
	// A client configured with kurz's short domain sends it as domain.
	host := id[:strings.LastIndex(id, "/")]
	if own := bitlyLink(t, c.do("POST", "/v4/shorten", fmt.Sprintf(`{"long_url":%q,"domain":%q}`, long, host)), http.StatusOK); own["id"] != id {
		t.Errorf("shortened on kurz's own host %s: %v; want the same bitlink %s", host, own, id)
	}
	if r := c.do("GET", "/v1/links/"+id[strings.LastIndex(id, "/")+1:], ""); r.code != http.StatusOK || r.json(t)["longUrl"] != long {
		t.Errorf("the bitlink through kurz's API: %s", r)
	}

	made := bitlyLink(t, c.do("POST", "/v4/bitlinks", fmt.Sprintf(`{"long_url":"%s/tagged","tags":["bitly"],"title":"Spring sale"}`, long)), http.StatusCreated)
	tagged := made["id"].(string)
	for _, path := range []string{"/v4/bitlinks/" + tagged, "/v4/bitlinks/" + url.PathEscape(tagged)} {
		if b := bitlyLink(t, c.do("GET", path, ""), http.StatusOK); b["id"] != tagged || fmt.Sprint(b["tags"]) != "[bitly]" || b["title"] != "Spring sale" {
			t.Errorf("GET %s: %v", path, b)
		}
	}
	changed := bitlyLink(t, c.do("PATCH", "/v4/bitlinks/"+tagged, fmt.Sprintf(`{"long_url":"%s/changed","tags":["bitly","moved"],"archived":false,"title":null}`, long)), http.StatusOK)
	if changed["long_url"] != long+"/changed" || fmt.Sprint(changed["tags"]) != "[bitly moved]" || changed["title"] != "Spring sale" {
		t.Errorf("PATCH: %v", changed)
	}
	if b := bitlyLink(t, c.do("PATCH", "/v4/bitlinks/"+tagged, `{"title":""}`), http.StatusOK); b["title"] != nil {
		t.Errorf("PATCH of an empty title: %v; want the title gone", b)
	}
	if r := c.do("POST", "/v4/expand", `{"bitlink_id":"`+tagged+`"}`); r.code != http.StatusOK || r.json(t)["long_url"] != long+"/changed" {
		t.Errorf("expand: %s", r)
	}

	r := c.do("GET", "/v4/bitlinks/"+tagged+"/clicks/summary?unit=day&units=7", "")
	if s := r.json(t); r.code != http.StatusOK || s["total_clicks"] != float64(0) || s["units"] != float64(7) {
		t.Errorf("clicks summary of a new link: %s", r)
	}
	r = c.do("GET", "/v4/bitlinks/"+tagged+"/clicks?unit=hour&units=3", "")
	var clicks struct {
		LinkClicks []struct {
			Clicks int64  `json:"clicks"`
			Date   string `json:"date"`
		} `json:"link_clicks"`
	}
	if err := json.Unmarshal(r.body, &clicks); r.code != http.StatusOK || err != nil || len(clicks.LinkClicks) != 3 ||
		!strings.HasSuffix(clicks.LinkClicks[0].Date, ":00:00+0000") || clicks.LinkClicks[0].Date <= clicks.LinkClicks[2].Date {
		t.Errorf("clicks by the hour: %s; want 3 hours, newest first", r)
	}

	if u := c.do("GET", "/v4/user", "").json(t); u["login"] != tn.id || u["default_group_guid"] != tn.id {
		t.Errorf("user: %v", u)
	}
	g := c.do("GET", "/v4/groups", "").json(t)
	if groups, _ := g["groups"].([]any); len(groups) != 1 || groups[0].(map[string]any)["guid"] != tn.id {
		t.Errorf("groups: %v", g)
	}
	var ids []string
	next := "/v4/groups/" + tn.id + "/bitlinks?size=1"
	for i := 0; next != "" && i < 5; i++ {
		var page struct {
			Links      []struct{ ID string }
			Pagination struct{ Next string }
		}
		r := c.do("GET", next, "")
		if err := json.Unmarshal(r.body, &page); r.code != http.StatusOK || err != nil {
			t.Fatalf("group's bitlinks: %s", r)
		}
		for _, l := range page.Links {
			ids = append(ids, l.ID)
		}
		next = page.Pagination.Next
	}
	if fmt.Sprint(ids) != fmt.Sprint([]string{tagged, id}) {
		t.Errorf("paged through %v; want %v, newest first", ids, []string{tagged, id})
	}

	if r := c.do("DELETE", "/v4/bitlinks/"+tagged, ""); r.code != http.StatusOK || !strings.Contains(string(r.body), `"links_deleted":[{"id":"`+tagged+`"`) {
		t.Errorf("DELETE: %s", r)
	}
	bitlyError(t, c.do("GET", "/v4/bitlinks/"+tagged, ""), http.StatusNotFound, "NOT_FOUND")
}

// Another tenant's bitlink is not found (404, nothing of it repeated),
// another tenant's group forbidden, a domain not the caller's refused as
// Bitly's INVALID_ARG_DOMAIN; a missing key is FORBIDDEN; a call not
// served is NOT_FOUND in Bitly's shape.
func TestBitlySeesOnlyTheTenantsLinks(t *testing.T) {
	gw := startGateway(t, nil)
	a, b := newTenant(t, gw, "free"), newTenant(t, gw, "free")
	ca, cb := newClient(t, gw, a.key), newClient(t, gw, b.key)
	long := "https://example.com/bitly-private/" + strings.ToLower(rand.Text())
	id := bitlyLink(t, ca.do("POST", "/v4/shorten", `{"long_url":"`+long+`"}`), http.StatusCreated)["id"].(string)

	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/v4/bitlinks/" + id, ""}, {"GET", "/v4/bitlinks/" + id + "/clicks", ""},
		{"PATCH", "/v4/bitlinks/" + id, `{"long_url":"https://evil.example/"}`}, {"DELETE", "/v4/bitlinks/" + id, ""},
		{"POST", "/v4/expand", `{"bitlink_id":"` + id + `"}`},
	} {
		if r := cb.do(tc.method, tc.path, tc.body); strings.Contains(string(r.body), long) {
			t.Errorf("%s %s of another tenant's link: %s carries its URL", tc.method, tc.path, r)
		} else {
			bitlyError(t, r, http.StatusNotFound, "NOT_FOUND")
		}
	}
	bitlyError(t, cb.do("GET", "/v4/groups/"+a.id+"/bitlinks", ""), http.StatusForbidden, "FORBIDDEN")
	bitlyError(t, cb.do("POST", "/v4/shorten", `{"long_url":"https://example.com/x","group_guid":"`+a.id+`"}`), http.StatusForbidden, "FORBIDDEN")
	e := bitlyError(t, ca.do("POST", "/v4/shorten", `{"long_url":"https://example.com/x","domain":"go.not-mine.test"}`), http.StatusBadRequest, "INVALID_ARG_DOMAIN")
	if fmt.Sprint(e["errors"]) != "[map[error_code:invalid field:domain]]" {
		t.Errorf("errors %v; want domain named", e["errors"])
	}
	bitlyError(t, newClient(t, gw, "").do("POST", "/v4/shorten", `{"long_url":"https://example.com/x"}`), http.StatusForbidden, "FORBIDDEN")
	bitlyError(t, ca.do("GET", "/v4/bitlinks/"+id+"/qr", ""), http.StatusNotFound, "NOT_FOUND")
	bitlyError(t, ca.do("POST", "/v4/custom_bitlinks", `{}`), http.StatusNotFound, "NOT_FOUND")
	if r := ca.do("GET", "/v4/bitlinks/"+id, ""); bitlyLink(t, r, http.StatusOK)["long_url"] != long {
		t.Errorf("the owner's link changed: %s", r)
	}
}

// A Bitly shorten counts as POST /v1/links against the edge quota: a rule
// on that route holds for it, and its 429 is RATE_LIMIT_EXCEEDED with
// Retry-After and the RateLimit fields.
func TestBitlyCallsCountAsTheKurzRouteTheyMirror(t *testing.T) {
	gw := gatewayWithAPIRule(t, `{name: creates, key: [api_key], match: {route: "POST /v1/links"}, algorithm: token_bucket, limit: 2, window: 1h, burst: 2, failure_mode: open}`)
	tn := newTenant(t, gw, "free")
	c := newClient(t, gw, tn.key)
	for i := range 2 {
		if r := c.do("POST", "/v1/links", fmt.Sprintf(`{"longUrl":"https://example.com/kurz/%d"}`, i)); r.code != http.StatusCreated {
			t.Fatalf("kurz create %d: %s", i, r)
		}
	}
	r := c.do("POST", "/v4/shorten", `{"long_url":"https://example.com/bitly"}`)
	bitlyError(t, r, http.StatusTooManyRequests, "RATE_LIMIT_EXCEEDED")
	if p, _, _ := ratePolicy(t, r.header); p != "api/creates" || r.header.Get("Retry-After") == "" {
		t.Errorf("Bitly shorten after two kurz creates: policy %q, Retry-After %q; want api/creates with Retry-After", p, r.header.Get("Retry-After"))
	}
	if r := c.do("GET", "/v4/groups/"+tn.id+"/bitlinks", ""); r.code != http.StatusOK {
		t.Errorf("a list, another route: %s; want it unaffected", r)
	}
}
