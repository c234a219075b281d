package console_test

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"kurz.dev/services/gateway/internal/console"
)

// serve answers one request from a mux holding only the console.
func serve(t *testing.T, method, path string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	h, err := console.New()
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	h.Register(mux)
	req := httptest.NewRequest(method, path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, req)
	return w
}

// Every file is served with its own content type, the strict CSP,
// nosniff, an ETag and Cache-Control: no-cache; /console/ is index.html;
// /console redirects there; unknown files are 404 (still under the CSP,
// without echoing the path); a matching If-None-Match is a 304.
func TestHandlerServesAssets(t *testing.T) {
	for _, tc := range []struct {
		path, contentType, contains string
	}{
		{"/console/", "text/html; charset=utf-8", `<script src="app.js" defer></script>`},
		{"/console/index.html", "text/html; charset=utf-8", `<link rel="stylesheet" href="style.css">`},
		{"/console/app.js", "text/javascript; charset=utf-8", "'use strict';"},
		{"/console/style.css", "text/css; charset=utf-8", "svg.chart"},
		{"/console/favicon.svg", "image/svg+xml", "<svg"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			w := serve(t, "GET", tc.path)
			h := w.Header()
			if w.Code != http.StatusOK || h.Get("Content-Type") != tc.contentType {
				t.Fatalf("GET %s: %d %q, want 200 %q", tc.path, w.Code, h.Get("Content-Type"), tc.contentType)
			}
			if !strings.Contains(w.Body.String(), tc.contains) {
				t.Errorf("GET %s: body lacks %q", tc.path, tc.contains)
			}
			if got := h.Get("Content-Security-Policy"); got != console.ContentSecurityPolicy {
				t.Errorf("GET %s: CSP %q, want %q", tc.path, got, console.ContentSecurityPolicy)
			}
			if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Cache-Control") != "no-cache" || !regexp.MustCompile(`^"[0-9a-f]{24}"$`).MatchString(h.Get("ETag")) {
				t.Errorf("GET %s: nosniff %q, Cache-Control %q, ETag %q", tc.path, h.Get("X-Content-Type-Options"), h.Get("Cache-Control"), h.Get("ETag"))
			}
			if w := serve(t, "GET", tc.path, "If-None-Match", h.Get("ETag")); w.Code != http.StatusNotModified || w.Body.Len() != 0 {
				t.Errorf("GET %s with its ETag: %d with %d bytes, want 304 and no body", tc.path, w.Code, w.Body.Len())
			}
		})
	}

	if w := serve(t, "HEAD", "/console/"); w.Code != http.StatusOK || w.Body.Len() != 0 {
		t.Errorf("HEAD /console/: %d with %d bytes, want 200 and no body", w.Code, w.Body.Len())
	}
	if w := serve(t, "GET", "/console"); w.Code != http.StatusMovedPermanently || w.Header().Get("Location") != "/console/" {
		t.Errorf("GET /console: %d Location %q, want 301 to /console/", w.Code, w.Header().Get("Location"))
	} else if h := w.Header(); h.Get("Content-Security-Policy") != console.ContentSecurityPolicy || h.Get("X-Content-Type-Options") != "nosniff" || h.Get("X-Frame-Options") != "DENY" {
		// Its body is HTML (a link to /console/): it is a console response too.
		t.Errorf("GET /console: CSP %q, nosniff %q, X-Frame-Options %q, want the console's headers",
			h.Get("Content-Security-Policy"), h.Get("X-Content-Type-Options"), h.Get("X-Frame-Options"))
	}
	for _, path := range []string{"/console/nothere.js", "/console/assets/app.js", "/console/x%3Cscript%3E"} {
		w := serve(t, "GET", path)
		if w.Code != http.StatusNotFound || w.Header().Get("Content-Security-Policy") != console.ContentSecurityPolicy ||
			w.Header().Get("X-Content-Type-Options") != "nosniff" || strings.Contains(w.Header().Get("Content-Type"), "html") {
			t.Errorf("GET %s: %d %q CSP %q, want 404 text under the CSP", path, w.Code, w.Header().Get("Content-Type"), w.Header().Get("Content-Security-Policy"))
		}
		if strings.Contains(w.Body.String(), "nothere") || strings.Contains(w.Body.String(), "script") {
			t.Errorf("GET %s: the 404 echoes the path: %q", path, w.Body.String())
		}
	}
}

// The console runs under a CSP without 'unsafe-inline', and renders API
// data without HTML parsing: the page has no inline script, style or event
// handler, and the script never assigns HTML or evaluates strings.
func TestAssetsNeedNoInlineCodeAndParseNoHTML(t *testing.T) {
	page := serve(t, "GET", "/console/").Body.String()
	for _, m := range regexp.MustCompile(`(?is)<script([^>]*)>(.*?)</script>`).FindAllStringSubmatch(page, -1) {
		if !strings.Contains(m[1], "src=") || strings.TrimSpace(m[2]) != "" {
			t.Errorf("inline script in index.html: %q", m[0])
		}
	}
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`(?i)<style`), regexp.MustCompile(`(?i)\sstyle=`), regexp.MustCompile(`(?i)\son[a-z]+=`),
		regexp.MustCompile(`(?i)javascript:`), regexp.MustCompile(`(?i)(src|href)="(https?:)?//`),
	} {
		if loc := bad.FindStringIndex(page); loc != nil {
			t.Errorf("index.html has %q (blocked by the CSP or loading from elsewhere)", page[loc[0]:loc[1]])
		}
	}
	js := serve(t, "GET", "/console/app.js").Body.String()
	for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "setAttribute('on"} {
		if strings.Contains(js, bad) {
			t.Errorf("app.js uses %s: render API data with textContent", bad)
		}
	}
}
