//go:build integration

package redirector

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkrules"
)

// TestPreviewAnswersAsTheRedirectWithoutAClick previews every kind of link
// over the handler's private Redis: an active link's page names its
// destination (escaped) and links to the short link; every link the
// redirect does not follow answers exactly as the redirect does; a
// protected or visit-limited link's page hides the destination; a ruled one
// names the redirect's choice for the request and says it varies. No
// preview records a click or spends a visit.
func TestPreviewAnswersAsTheRedirectWithoutAClick(t *testing.T) {
	clicks := &keptClicks{}
	past := time.Now().Add(-time.Hour).UnixMilli()
	const hash = "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA" // never checked: a preview asks no password
	mux, rdb := serveRedis(t, benchConfig(), clicks, nil, map[string]linkcache.Entry{
		"plain01": {State: linkcache.Active, URL: "https://example.com/plain", Tenant: "t"},
		"hostile": {State: linkcache.Active, URL: hostileURL, Tenant: "t"},
		"secret1": {State: linkcache.Active, URL: "https://example.com/secret", Tenant: "t", PasswordHash: hash},
		"ruled01": {State: linkcache.Active, URL: "https://example.com/default", Tenant: "t", Rules: ruled(t), Targets: &linkcache.Targets{IOS: "https://example.com/ios-only"}},
		"limited": {State: linkcache.Active, URL: "https://example.com/limited", Tenant: "t", MaxVisits: 2},
		"spent01": {State: linkcache.Active, URL: "https://example.com/spent", Tenant: "t", MaxVisits: 1},
		"spent02": {State: linkcache.Active, URL: "https://example.com/spent-secret", Tenant: "t", MaxVisits: 1, PasswordHash: hash},
		"gone001": {State: linkcache.Gone, Tenant: "t"},
		"expired": {State: linkcache.Active, URL: "https://example.com/expired", Tenant: "t", ExpiresAtMs: past},
		"suspend": {State: linkcache.Active, URL: "https://example.com/suspended", Tenant: "suspended-7"},
		"missing": {State: linkcache.Missing},
		"loop001": {State: linkcache.Active, URL: "https://" + shortHost + "/loop001", Tenant: "t"},
	})
	ctx := context.Background()
	for _, code := range []string{"spent01", "spent02"} {
		if err := rdb.Set(ctx, linkcache.VisitsKey(code), 1, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	serve := func(method, path string) *httptest.ResponseRecorder { return serveDesktop(mux, method, path) }

	for _, tc := range []struct{ code, want, not string }{
		{"plain01", "<code>https://example.com/plain</code>", "another destination"},
		{"hostile", "<code>https://example.com/&#34;&gt;&lt;script&gt;", "<script"},
		{"secret1", "protected by a password", "example.com/secret"},
		{"ruled01", "<code>https://example.com/", "example.com/default"}, // a variant: they take every visit no rule takes
		{"limited", "limited number of visits", "example.com/limited"},
	} {
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			w := serve(method, "/"+tc.code+"+")
			hdr := w.Header()
			if w.Code != http.StatusOK || hdr.Get("Location") != "" || !strings.HasPrefix(hdr.Get("Content-Security-Policy"), "default-src 'none';") ||
				hdr.Get("Referrer-Policy") != "no-referrer" || hdr.Get("X-Content-Type-Options") != "nosniff" ||
				!strings.Contains(hdr.Get("X-Robots-Tag"), "noindex") || hdr.Get("X-Source") == "" {
				t.Fatalf("%s %s+: %d, headers %v", method, tc.code, w.Code, hdr)
			}
			wantCC := "private, max-age=0"
			if tc.code == "secret1" || tc.code == "limited" {
				wantCC = "no-store"
			}
			if cc := hdr.Get("Cache-Control"); cc != wantCC {
				t.Errorf("%s %s+: Cache-Control %q, want %q", method, tc.code, cc, wantCC)
			}
			if method == http.MethodHead {
				continue
			}
			body := w.Body.String()
			if !strings.Contains(body, tc.want) || strings.Contains(body, tc.not) || !strings.Contains(body, `<a href="/`+tc.code+`"`) {
				t.Errorf("GET %s+: want %q and a link to /%s, not %q:\n%s", tc.code, tc.want, tc.code, tc.not, body)
			}
			if varies := strings.Contains(body, "another destination"); varies != (tc.code == "ruled01") {
				t.Errorf("GET %s+: says the destination varies: %v", tc.code, varies)
			}
		}
	}

	// Answered as the redirect answers them, before and after L1 holds them.
	for range 2 {
		for _, code := range []string{"spent01", "spent02", "gone001", "expired", "suspend", "missing", "loop001"} {
			redirect, preview := serve(http.MethodGet, "/"+code), serve(http.MethodGet, "/"+code+"+")
			if preview.Code != redirect.Code || preview.Code < 400 || preview.Body.String() != redirect.Body.String() ||
				preview.Header().Get("Cache-Control") != redirect.Header().Get("Cache-Control") {
				t.Errorf("%s: preview %d %q, redirect %d %q", code, preview.Code, preview.Body, redirect.Code, redirect.Body)
			}
		}
	}

	clicks.mu.Lock()
	n := len(clicks.events)
	clicks.mu.Unlock()
	if n != 0 {
		t.Errorf("%d clicks recorded; previews and refused redirects record none", n)
	}
	if v, err := rdb.Get(ctx, linkcache.VisitsKey("limited")).Result(); !errors.Is(err, redis.Nil) {
		t.Errorf("the visit-limited link's counter is %q (%v) after previews; want none", v, err)
	}
	if w := serve(http.MethodGet, "/plain01"); w.Code != http.StatusFound || len(clicks.events) != 1 {
		t.Errorf("the redirect after its previews: %d, %d clicks; want 302 and one", w.Code, len(clicks.events))
	}
}

// TestPreviewsShareTheWalkBound: a preview is a lookup as a redirect is, so
// redirects and previews of distinct codes past L1 draw on one bucket per
// client address, and the preview past it is 429.
func TestPreviewsShareTheWalkBound(t *testing.T) {
	cfg := benchConfig()
	cfg.WalkRate, cfg.WalkBurst = 0.001, 3
	entries := map[string]linkcache.Entry{}
	for _, code := range []string{"walk001", "walk002", "walk003", "walk004"} {
		entries[code] = linkcache.Entry{State: linkcache.Active, URL: "https://example.com/" + code, Tenant: "t"}
	}
	mux := serveEntries(t, cfg, &keptClicks{}, entries)
	serve := func(path, addr string) int {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Host = shortHost
		req.RemoteAddr = addr + ":1234"
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		return w.Code
	}
	for _, step := range []struct {
		path, addr string
		want       int
	}{
		{"/walk001", "198.51.100.1", http.StatusFound},
		{"/walk002+", "198.51.100.1", http.StatusOK},
		{"/walk003+", "198.51.100.1", http.StatusOK},
		{"/walk004+", "198.51.100.1", http.StatusTooManyRequests},
		{"/walk004", "198.51.100.1", http.StatusTooManyRequests},
		{"/walk004+", "198.51.100.2", http.StatusOK}, // another client's bucket
		{"/walk002+", "198.51.100.1", http.StatusOK}, // in L1 now: no lookup to bound
	} {
		if got := serve(step.path, step.addr); got != step.want {
			t.Fatalf("GET %s from %s: %d, want %d", step.path, step.addr, got, step.want)
		}
	}
}

// TestPreviewOnCustomDomains: a custom domain previews its own links, as
// it redirects them; another tenant's link and an unknown host are 404.
func TestPreviewOnCustomDomains(t *testing.T) {
	hosts := NewHosts([]string{shortHost})
	hosts.SetDomains(map[string]string{"go.acme.test": "acme"})
	mux := serveHosts(t, benchConfig(), &keptClicks{}, hosts, map[string]linkcache.Entry{
		"go.acme.test/launch1": {State: linkcache.Active, URL: "https://example.com/acme", Tenant: "acme"},
		"go.acme.test/stolen1": {State: linkcache.Active, URL: "https://example.com/other", Tenant: "other"},
		"launch1":              {State: linkcache.Missing}, // as PostgreSQL leaves it: these handlers ask no limiter
	})
	for _, tc := range []struct {
		host, path string
		want       int
	}{
		{"go.acme.test", "/launch1+", http.StatusOK},
		{"go.acme.test", "/stolen1+", http.StatusNotFound},
		{"unknown.test", "/launch1+", http.StatusNotFound},
		{shortHost, "/launch1+", http.StatusNotFound}, // not a default-domain code
	} {
		req := httptest.NewRequest(http.MethodGet, tc.path, nil)
		req.Host = tc.host
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		if w.Code != tc.want || tc.want == http.StatusOK && !strings.Contains(w.Body.String(), "https://example.com/acme") {
			t.Errorf("GET %s%s: %d, want %d:\n%s", tc.host, tc.path, w.Code, tc.want, w.Body)
		}
	}
}

// TestPreviewRevealsNoMoreThanTheRedirect: a preview names the destination
// the redirect would send the same request to, and none the redirect keeps
// from it. A visit-limited link's destination is shown only by a visit that
// spends one (a HEAD or a preview fetcher's GET gets no Location either),
// so a one-time link previewed any number of times is still unread; a link
// whose variants take every visit no rule takes never sends anyone to its
// URL, so the preview must not name it; a rule the request matches is the
// destination the redirect would give it.
func TestPreviewRevealsNoMoreThanTheRedirect(t *testing.T) {
	variants := &linkrules.Set{Variants: []linkrules.Variant{{Name: "a", URL: "https://example.com/variant-a", Weight: 1}}}
	if err := variants.Compile(); err != nil {
		t.Fatal(err)
	}
	mux := serveEntries(t, benchConfig(), &keptClicks{}, map[string]linkcache.Entry{
		"onetime": {State: linkcache.Active, URL: "https://example.com/one-time-secret", Tenant: "t", MaxVisits: 1},
		"abtest1": {State: linkcache.Active, URL: "https://example.com/never-served", Tenant: "t", Rules: variants},
		"ruled02": {State: linkcache.Active, URL: "https://example.com/default", Tenant: "t", Rules: ruled(t)},
	})
	serve := func(method, path string) *httptest.ResponseRecorder { return serveDesktop(mux, method, path) }
	if w := serve(http.MethodHead, "/onetime"); w.Header().Get("Location") != "" {
		t.Fatalf("HEAD /onetime names its destination: %v", w.Header())
	}
	for _, tc := range []struct{ path, want, not string }{
		{"/onetime+", "limited number of visits", "one-time-secret"},
		{"/abtest1+", "<code>https://example.com/variant-a</code>", "never-served"},
		{"/ruled02+?debug", "<code>https://example.com/debug</code>", "example.com/default"},
	} {
		w := serve(http.MethodGet, tc.path)
		if body := w.Body.String(); w.Code != http.StatusOK || !strings.Contains(body, tc.want) || strings.Contains(body, tc.not) {
			t.Errorf("GET %s: %d, want %q and not %q:\n%s", tc.path, w.Code, tc.want, tc.not, body)
		}
	}
	// The redirect agrees: what the preview named is where its link, which
	// keeps the query the choice was made for, sends.
	if body := serve(http.MethodGet, "/ruled02+?debug").Body.String(); !strings.Contains(body, `href="/ruled02?debug"`) {
		t.Errorf("GET /ruled02+?debug links elsewhere than /ruled02?debug:\n%s", body)
	}
	if w := serve(http.MethodGet, "/ruled02?debug"); w.Header().Get("Location") != "https://example.com/debug" {
		t.Errorf("GET /ruled02?debug: Location %q", w.Header().Get("Location"))
	}
}

// TestPreviewShowsAnASCIIDestination: the shortener stores hosts in
// punycode and percent-encodes every other non-ASCII byte, but a preview
// must not trust that of an entry (one written before, or by another
// path): a Unicode host shown as text is a homograph ("аpple.com" with a
// Cyrillic "а"), and a bidi override reorders the text around it. The page
// shows the host in punycode and escapes the rest.
func TestPreviewShowsAnASCIIDestination(t *testing.T) {
	mux := serveEntries(t, benchConfig(), &keptClicks{}, map[string]linkcache.Entry{
		"unicode": {State: linkcache.Active, URL: "https://\u0430pple.com/\u202egpj.exe?q=\u00e4#\u2028x", Tenant: "t"},
	})
	w := serveDesktop(mux, http.MethodGet, "/unicode+")
	body := w.Body.String()
	const want = "<code>https://xn--pple-43d.com/%E2%80%AEgpj.exe?q=%C3%A4#%E2%80%A8x</code>"
	if w.Code != http.StatusOK || !strings.Contains(body, want) || strings.ContainsFunc(body, func(r rune) bool { return r > 0x7f }) {
		t.Errorf("GET /unicode+: %d, want %q and nothing but ASCII:\n%s", w.Code, want, body)
	}
}

// serveDesktop is mux's answer to a desktop browser's request of path on
// the short host.
func serveDesktop(mux *http.ServeMux, method, path string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, nil)
	req.Host = shortHost
	req.Header.Set("User-Agent", windows)
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, req)
	return w
}
