//go:build integration

package app

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// yourlsPost posts form as application/x-www-form-urlencoded to path (the
// YOURLS API) as c's client, without its Authorization.
func yourlsPost(c *client, path string, form url.Values) response {
	c.t.Helper()
	return c.with("").do("POST", path, form.Encode(), "Content-Type", "", "Content-Type", "application/x-www-form-urlencoded")
}

// uniqueWord is an alias no other test or run uses.
func uniqueWord(t *testing.T, prefix string) string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s%x", prefix, b)
}

// shorturl creates a link as YOURLS's API does, in its json format: the
// answer carries status success, statusCode 200, the short URL, its title,
// and url{keyword,url,title,date}; the link is the tenant's, with the
// title, seen through the kurz API, and expand answers the title too. Shortening the URL again answers YOURLS's duplicate: status fail,
// code error:url, statusCode 200 and the same short URL. Format simple
// answers the short URL as text, and a multipart form is read as well.
func TestYOURLSShorturlCreatesTheTenantsLink(t *testing.T) {
	gw := startGateway(t, nil)
	ten := newTenant(t, gw, "free")
	c := newClient(t, gw, ten.key)
	long := "https://example.com/yourls/" + uniqueWord(t, "p")

	r := yourlsPost(c, "/yourls-api.php", url.Values{"action": {"shorturl"}, "url": {long}, "title": {"A page"}, "signature": {ten.key}})
	if r.code != http.StatusOK || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("shorturl: %s", r)
	}
	m := r.json(t)
	u, _ := m["url"].(map[string]any)
	short, _ := m["shorturl"].(string)
	if m["status"] != "success" || m["statusCode"] != float64(200) || short == "" || u == nil || u["url"] != long || u["date"] == "" ||
		m["title"] != "A page" || u["title"] != "A page" {
		t.Fatalf("shorturl answer: %s", r.body)
	}
	code, _ := u["keyword"].(string)
	if !strings.HasSuffix(short, "/"+code) {
		t.Errorf("shorturl %q does not end in its keyword %q", short, code)
	}
	if got := c.do("GET", "/v1/links/"+code, "").json(t); got["longUrl"] != long || got["title"] != "A page" {
		t.Errorf("GET /v1/links/%s: %v, want the tenant's link to %s titled A page", code, got, long)
	}
	r = yourlsPost(c, "/yourls-api.php", url.Values{"action": {"expand"}, "shorturl": {code}, "signature": {ten.key}})
	if m := r.json(t); r.code != http.StatusOK || m["title"] != "A page" {
		t.Errorf("expand: %s; want the link's title", r)
	}
	r = yourlsPost(c, "/yourls-api.php", url.Values{"action": {"shorturl"}, "url": {long + "/nl"}, "title": {"two\nlines"}, "signature": {ten.key}})
	if m := r.json(t); r.code != http.StatusBadRequest || m["status"] != "fail" {
		t.Errorf("a title with a newline: %s; want 400, nothing created", r)
	}

	r = yourlsPost(c, "/yourls-api.php", url.Values{"action": {"shorturl"}, "url": {long}, "signature": {ten.key}})
	m = r.json(t)
	if r.code != http.StatusOK || m["status"] != "fail" || m["code"] != "error:url" || m["shorturl"] != short ||
		!strings.Contains(m["message"].(string), "already exists") {
		t.Errorf("shortening %s again: %s; want YOURLS's error:url with %s", long, r, short)
	}

	r = yourlsPost(c, "/yourls-api", url.Values{"action": {"shorturl"}, "url": {long + "/simple"}, "format": {"simple"}, "signature": {ten.key}})
	if r.code != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") ||
		!strings.HasPrefix(string(r.body), "http") || strings.ContainsAny(string(r.body), "{\n") {
		t.Errorf("format simple: %s %q; want the short URL as text", r, r.header.Get("Content-Type"))
	}

	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for k, v := range map[string]string{"action": "shorturl", "url": long + "/multipart", "signature": ten.key} {
		_ = mw.WriteField(k, v)
	}
	_ = mw.Close()
	r = c.with("").do("POST", "/yourls-api.php", b.String(), "Content-Type", "", "Content-Type", mw.FormDataContentType())
	if r.code != http.StatusOK || r.json(t)["status"] != "success" {
		t.Errorf("multipart shorturl: %s", r)
	}
}

// A keyword is the link's alias; one already taken answers YOURLS's
// error:keyword with 400 (as YOURLS, where kurz says 409), and an invalid URL its error:nourl with 400,
// both status fail.
func TestYOURLSShorturlRefusesATakenKeywordAndABadURL(t *testing.T) {
	gw := startGateway(t, nil)
	ten := newTenant(t, gw, "free")
	c := newClient(t, gw, ten.key)
	kw := uniqueWord(t, "yk")

	r := yourlsPost(c, "/yourls-api.php", url.Values{"action": {"shorturl"}, "url": {"https://example.com/kw-1"}, "keyword": {kw}, "signature": {ten.key}})
	if m := r.json(t); r.code != http.StatusOK || m["status"] != "success" || !strings.HasSuffix(m["shorturl"].(string), "/"+kw) {
		t.Fatalf("shorturl with keyword %s: %s", kw, r)
	}
	r = yourlsPost(c, "/yourls-api.php", url.Values{"action": {"shorturl"}, "url": {"https://example.com/kw-2"}, "keyword": {kw}, "signature": {ten.key}})
	if m := r.json(t); r.code != http.StatusBadRequest || m["status"] != "fail" || m["code"] != "error:keyword" || m["errorCode"] != float64(r.code) ||
		m["message"] != fmt.Sprintf("the alias %q is already taken; choose another", kw) || m["reason"] != "ALIAS_TAKEN" {
		t.Errorf("keyword taken: %s; want YOURLS's error:keyword with the shortener's message", r)
	}
	r = yourlsPost(c, "/yourls-api.php", url.Values{"action": {"shorturl"}, "url": {"javascript:alert(1)"}, "signature": {ten.key}})
	if m := r.json(t); r.code != http.StatusBadRequest || m["status"] != "fail" || m["code"] != "error:nourl" || m["statusCode"] != float64(400) ||
		strings.Contains(m["message"].(string), "rpc error") {
		t.Errorf("bad URL: %s; want 400 with YOURLS's error:nourl", r)
	}
}

// A url without a scheme, as a person pastes it, is an http URL, as
// YOURLS reads it; a scheme kurz does not shorten is still refused.
func TestYOURLSShorturlReadsAURLWithoutSchemeAsHTTP(t *testing.T) {
	gw := startGateway(t, nil)
	ten := newTenant(t, gw, "free")
	c := newClient(t, gw, ten.key)
	page := uniqueWord(t, "bare")
	r := yourlsPost(c, "/yourls-api.php", url.Values{"action": {"shorturl"}, "url": {" Example.com/" + page}, "signature": {ten.key}})
	m := r.json(t)
	u, _ := m["url"].(map[string]any)
	if r.code != http.StatusOK || m["status"] != "success" || u == nil || u["url"] != "http://example.com/"+page {
		t.Fatalf("shorturl of Example.com/%s: %s; want the link to http://example.com/%s", page, r, page)
	}
	for _, raw := range []string{"example.com:8080/x", "ftp://example.com/x", "//example.com/x"} {
		r := yourlsPost(c, "/yourls-api.php", url.Values{"action": {"shorturl"}, "url": {raw}, "signature": {ten.key}})
		if m := r.json(t); r.code != http.StatusBadRequest || m["code"] != "error:nourl" {
			t.Errorf("shorturl of %s: %s; want 400 error:nourl", raw, r)
		}
	}
}

// expand and url-stats answer for the tenant's own links only: another
// tenant's link, by keyword or short URL, is not found (404 in YOURLS's
// shape). url-stats' clicks are the link's stats' total.
func TestYOURLSExpandAndStatsSeeOnlyTheTenantsLinks(t *testing.T) {
	gw := startGateway(t, nil)
	a, b := newTenant(t, gw, "free"), newTenant(t, gw, "free")
	ca, cb := newClient(t, gw, a.key), newClient(t, gw, b.key)
	long := "https://example.com/expand/" + uniqueWord(t, "e")
	r := yourlsPost(ca, "/yourls-api.php", url.Values{"action": {"shorturl"}, "url": {long}, "signature": {a.key}})
	short, _ := r.json(t)["shorturl"].(string)
	if short == "" {
		t.Fatalf("shorturl: %s", r)
	}
	code := short[strings.LastIndex(short, "/")+1:]

	for _, s := range []string{short, code} {
		r = yourlsPost(ca, "/yourls-api.php", url.Values{"action": {"expand"}, "shorturl": {s}, "signature": {a.key}})
		if m := r.json(t); r.code != http.StatusOK || m["longurl"] != long || m["keyword"] != code || m["shorturl"] != short {
			t.Errorf("expand %s as its tenant: %s", s, r)
		}
		r = yourlsPost(cb, "/yourls-api.php", url.Values{"action": {"expand"}, "shorturl": {s}, "signature": {b.key}})
		if m := r.json(t); r.code != http.StatusNotFound || m["errorCode"] != float64(404) || strings.Contains(string(r.body), long) {
			t.Errorf("expand %s as another tenant: %s; want 404 without the long URL", s, r)
		}
	}
	r = yourlsPost(ca, "/yourls-api.php", url.Values{"action": {"expand"}, "shorturl": {code}, "format": {"simple"}, "signature": {a.key}})
	if r.code != http.StatusOK || string(r.body) != long {
		t.Errorf("expand, format simple: %s; want %s", r, long)
	}

	stats := ca.do("GET", "/v1/links/"+code+"/stats", "").json(t)
	total := "0"
	if counts, ok := stats["counts"].(map[string]any); ok && counts["total"] != nil {
		total = fmt.Sprint(counts["total"])
	}
	r = yourlsPost(ca, "/yourls-api.php", url.Values{"action": {"url-stats"}, "shorturl": {short}, "signature": {a.key}})
	link, _ := r.json(t)["link"].(map[string]any)
	if r.code != http.StatusOK || link == nil || link["clicks"] != total || link["url"] != long || link["shorturl"] != short {
		t.Errorf("url-stats: %s; want clicks %s (the stats' total)", r, total)
	}
	r = yourlsPost(cb, "/yourls-api.php", url.Values{"action": {"url-stats"}, "shorturl": {short}, "signature": {b.key}})
	if r.code != http.StatusNotFound {
		t.Errorf("url-stats of another tenant's link: %s; want 404", r)
	}
	r = yourlsPost(ca, "/yourls-api.php", url.Values{"action": {"version"}, "signature": {a.key}})
	if v, _ := r.json(t)["version"].(string); r.code != http.StatusOK || v == "" {
		t.Errorf("version: %s", r)
	}
}

// The API takes its parameters in a POST body only: a GET is 405 and a
// signature in the query string 400, each saying to POST it, and the key
// appears in no log line. A wrong signature is 401 in YOURLS's shape (and
// counts as a failed authentication), no signature 401 too, a
// Content-Type that cannot be read 400, and a body over 16 KiB 413; xml is
// refused by name.
func TestYOURLSRefusesKeysInURLsBadSignaturesAndLargeBodies(t *testing.T) {
	log, logs := captureLogs(t)
	gw := startGatewayLogging(t, log, nil)
	ten := newTenant(t, gw, "free")
	c := newClient(t, gw, ten.key).with("")
	q := url.Values{"action": {"shorturl"}, "url": {"https://example.com/get"}, "signature": {ten.key}}.Encode()

	r := c.do("GET", "/yourls-api.php?"+q, "")
	if r.code != http.StatusMethodNotAllowed || !strings.Contains(r.json(t)["detail"].(string), "POST") {
		t.Errorf("GET with the key in the URL: %s; want 405 saying to POST", r)
	}
	r = c.do("POST", "/yourls-api.php?"+q, "", "Content-Type", "application/x-www-form-urlencoded")
	if m := r.json(t); r.code != http.StatusBadRequest || m["status"] != "fail" || !strings.Contains(m["message"].(string), "POST body") {
		t.Errorf("POST with the key in the URL: %s; want 400 saying to send it in the body", r)
	}
	if strings.Contains(logs.String(), keySecret(t, ten.key)) {
		t.Errorf("the logs hold the key sent in a URL")
	}

	r = yourlsPost(c, "/yourls-api.php", url.Values{"action": {"version"}, "signature": {"kurz_nokey_0123456789abcdef0123456789abcdef"}})
	if m := r.json(t); r.code != http.StatusUnauthorized || m["status"] != "fail" || m["errorCode"] != float64(401) || m["message"] == "" {
		t.Errorf("bad signature: %s; want 401 in YOURLS's shape", r)
	}
	r = yourlsPost(c, "/yourls-api.php", url.Values{"action": {"version"}})
	if r.code != http.StatusUnauthorized || r.json(t)["status"] != "fail" {
		t.Errorf("no signature: %s; want 401", r)
	}
	r = yourlsPost(c, "/yourls-api.php", url.Values{"action": {"version"}, "format": {"xml"}, "signature": {ten.key}})
	if r.code != http.StatusBadRequest || !strings.Contains(r.json(t)["message"].(string), `"xml" is not served`) {
		t.Errorf("format xml: %s; want 400 naming it", r)
	}
	// A Content-Type that cannot be read, or is not a form's, is not taken
	// for a form: the body could be anything its sender meant by it.
	form := url.Values{"action": {"version"}, "signature": {ten.key}}.Encode()
	for _, ct := range []string{";", "text/plain"} {
		r = c.do("POST", "/yourls-api.php", form, "Content-Type", "", "Content-Type", ct)
		if m := r.json(t); r.code != http.StatusBadRequest || m["status"] != "fail" || !strings.Contains(m["message"].(string), "Content-Type") {
			t.Errorf("Content-Type %q: %s; want 400 naming it", ct, r)
		}
	}
	r = yourlsPost(c, "/yourls-api.php", url.Values{"action": {"shorturl"}, "signature": {ten.key}, "title": {strings.Repeat("t", 16<<10)}})
	if r.code != http.StatusRequestEntityTooLarge || r.json(t)["status"] != "fail" {
		t.Errorf("a 16 KiB title: %s; want 413", r)
	}
}

// An action the API does not serve, or none, is refused after the key was
// checked, and is charged to the key's edge quota as version is: a valid
// key gets no unmetered requests by naming no action.
func TestYOURLSChargesRefusedActionsToTheEdgeQuota(t *testing.T) {
	gw := startGateway(t, nil)
	ten := newTenant(t, gw, "free")
	c := newClient(t, gw, ten.key)
	for _, action := range []string{"stats", ""} {
		r := yourlsPost(c, "/yourls-api.php", url.Values{"action": {action}, "signature": {ten.key}})
		if r.code != http.StatusBadRequest || r.json(t)["status"] != "fail" {
			t.Fatalf("action %q: %s; want 400 in YOURLS's shape", action, r)
		}
		if r.header.Get("RateLimit") == "" {
			t.Fatalf("action %q: %s without RateLimit fields; want it charged to the edge quota", action, r)
		}
		if p, _, _ := rateLimit(t, r.header); p != "api/per-api-key" {
			t.Errorf("action %q charged to %q; want api/per-api-key", action, p)
		}
	}
}

// A refused action is named in the answer only when it is short: a
// stranger's body is not sent back, in either format.
func TestYOURLSDoesNotEchoALongAction(t *testing.T) {
	gw := startGateway(t, nil)
	ten := newTenant(t, gw, "free")
	c := newClient(t, gw, ten.key)
	long := strings.Repeat("<b>x", 2000)
	for _, format := range []string{"json", "simple"} {
		r := yourlsPost(c, "/yourls-api.php", url.Values{"action": {long}, "format": {format}, "signature": {ten.key}})
		if r.code != http.StatusBadRequest || strings.Contains(string(r.body), "<b>x<b>x") || len(r.body) > 1024 {
			t.Errorf("format %s, an action of %d bytes: %d, %d bytes; want 400 without the action", format, len(long), r.code, len(r.body))
		}
	}
	r := yourlsPost(c, "/yourls-api.php", url.Values{"action": {"db-stats"}, "signature": {ten.key}})
	if m := r.json(t); r.code != http.StatusBadRequest || !strings.Contains(m["message"].(string), `"db-stats"`) {
		t.Errorf("action db-stats: %s; want 400 naming it", r)
	}
}

// The API's two paths are one route to the limiter where a call mirrors
// no kurz route (version): a rule on POST /yourls-api.php holds whichever
// path a client calls, so alternating them doubles nothing.
func TestYOURLSChargesBothPathsAsOneRoute(t *testing.T) {
	gw := gatewayWithAPIRule(t, `{name: yourls, key: [api_key], match: {route: "POST /yourls-api.php"}, algorithm: token_bucket, limit: 2, window: 1h, burst: 2, failure_mode: open}`)
	ten := newTenant(t, gw, "free")
	c := newClient(t, gw, ten.key)
	for i, path := range []string{"/yourls-api", "/yourls-api.php", "/yourls-api"} {
		r := yourlsPost(c, path, url.Values{"action": {"version"}, "signature": {ten.key}})
		want := http.StatusOK
		if i == 2 {
			want = http.StatusTooManyRequests
		}
		if p, _, _ := ratePolicy(t, r.header); r.code != want || p != "api/yourls" {
			t.Errorf("version %d on %s: %s, policy %q; want %d by api/yourls", i+1, path, r, p, want)
		}
	}
}
