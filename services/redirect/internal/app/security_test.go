//go:build integration

package app

import (
	"net/url"
	"strings"
	"testing"
)

// The redirect service never reflects request data into HTML, and never
// into a Location: requests carrying a script tag in the path, the code, the
// query, and in every header a client controls (User-Agent, Referer,
// X-Forwarded-For, Cookie, Accept) are answered by a redirect whose Location
// is exactly the stored target, or by one of the fixed pages (text/html with
// X-Content-Type-Options: nosniff and Content-Security-Policy: default-src
// 'none'), or by an ops endpoint; no answer holds the tag, in its body or in
// any header.
func TestRedirectNeverReflectsRequestsIntoHTML(t *testing.T) {
	const xss = `<script>alert("kurz")</script>`
	f := newFixture(t)
	code, gone, unknown := f.code(), f.code(), f.code()
	const target = "https://example.com/target"
	f.insert(code, "t", target, 0, nil, false)
	f.insert(gone, "t", "https://example.com/gone", 0, nil, true)
	r := start(t, map[string]string{"KURZ_REDIRECT_TRUSTED_PROXIES": "127.0.0.1/32,::1"}, hooks{})
	q := url.PathEscape(xss)
	headers := []string{"User-Agent", xss, "Referer", "https://example.com/?" + xss, "X-Forwarded-For", xss,
		"Cookie", "a=" + q, "Accept", "text/html"}
	for _, tc := range []struct {
		name, method, path string
		header             []string
		status             int
	}{
		{"tag as the code", "GET", "/" + q, nil, 404},
		{"tag as the code, raw", "GET", "/" + xss, nil, 404},
		{"tag after a code", "GET", "/" + code + "/" + q, nil, 404},
		{"tag in the query of a link", "GET", "/" + code + "?" + xss, nil, 302},
		{"tag in the query of a link, encoded", "GET", "/" + code + "?next=" + q, nil, 302},
		{"tag in the query of an unknown code", "GET", "/" + unknown + "?x=" + q, nil, 404},
		{"tag in the query of a revoked link", "GET", "/" + gone + "?x=" + q, nil, 410},
		{"tag in the headers of a link", "GET", "/" + code, headers, 302},
		{"tag in the headers of an unknown code", "GET", "/" + unknown, headers, 404},
		{"tag in the headers, HEAD", "HEAD", "/" + code + "?" + xss, headers, 302},
		{"tag in the fragment-like path", "GET", "/" + code + "%23" + q, nil, 404},
		{"other method", "POST", "/" + code + "?" + xss, headers, 0},
		{"healthz", "GET", "/healthz?" + xss, headers, 200},
		{"readyz", "GET", "/readyz?" + xss, headers, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := do(t, tc.method, r.HTTP+tc.path, tc.header...)
			body := resp.Header.Get("X-Test-Body")
			resp.Header.Del("X-Test-Body")
			if tc.status != 0 && resp.StatusCode != tc.status {
				t.Errorf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.status)
			}
			if low := strings.ToLower(body); strings.Contains(low, "<script") || strings.Contains(low, "</script") || strings.Contains(body, "kurz\")") {
				t.Errorf("%s %s: %d reflects the tag: %q", tc.method, tc.path, resp.StatusCode, body)
			}
			for name, vs := range resp.Header {
				for _, v := range vs {
					if strings.Contains(strings.ToLower(v), "script") {
						t.Errorf("%s %s: header %s: %q reflects the request", tc.method, tc.path, name, v)
					}
				}
			}
			switch ct := resp.Header.Get("Content-Type"); {
			case resp.StatusCode >= 300 && resp.StatusCode < 400:
				if loc := resp.Header.Get("Location"); loc != target || body != "" {
					t.Errorf("%s %s: Location %q with body %q; want exactly %q and no body", tc.method, tc.path, loc, body, target)
				}
			case strings.HasPrefix(ct, "text/html"):
				if ct != "text/html; charset=utf-8" || resp.Header.Get("X-Content-Type-Options") != "nosniff" ||
					resp.Header.Get("Content-Security-Policy") != "default-src 'none'" {
					t.Errorf("%s %s: page with Content-Type %q, X-Content-Type-Options %q, Content-Security-Policy %q; want text/html; charset=utf-8, nosniff, default-src 'none'",
						tc.method, tc.path, ct, resp.Header.Get("X-Content-Type-Options"), resp.Header.Get("Content-Security-Policy"))
				}
			case body != "" && ct == "":
				t.Errorf("%s %s: %d body without a Content-Type: %q", tc.method, tc.path, resp.StatusCode, body)
			}
		})
	}
}
