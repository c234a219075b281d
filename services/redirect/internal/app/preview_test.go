//go:build integration

package app

import (
	"strings"
	"testing"
)

// TestPreviewThroughTheReadPath: GET /{code}+ of a link only PostgreSQL
// holds is looked up as its redirect is (PostgreSQL, then the entry it
// left in Redis), names the destination, and is counted in
// kurz.redirect.previews, not as a redirect request; a disabled link's
// preview answers its redirect's 410.
func TestPreviewThroughTheReadPath(t *testing.T) {
	f := newFixture(t)
	r := start(t, nil, hooks{})
	code, off := f.code(), f.code()
	f.insert(code, "t", "https://example.com/preview?a=1&b=<2>", 0, nil, false)
	f.insert(off, "t", "https://example.com/off", 0, nil, true)

	for _, source := range []string{"db", "cache"} {
		resp := get(t, r.HTTP, "/"+code+"+")
		body := resp.Header.Get("X-Test-Body")
		if resp.StatusCode != 200 || resp.Header.Get("X-Source") != source ||
			!strings.Contains(body, "<code>https://example.com/preview?a=1&amp;b=&lt;2&gt;</code>") || !strings.Contains(body, `href="/`+code+`"`) {
			t.Fatalf("preview from %s: %d, X-Source %q:\n%s", source, resp.StatusCode, resp.Header.Get("X-Source"), body)
		}
	}
	preview, redirect := get(t, r.HTTP, "/"+off+"+"), get(t, r.HTTP, "/"+off)
	if preview.StatusCode != 410 || redirect.StatusCode != 410 || preview.Header.Get("X-Test-Body") != redirect.Header.Get("X-Test-Body") {
		t.Errorf("disabled link: preview %d, redirect %d; want both 410, one page", preview.StatusCode, redirect.StatusCode)
	}
	if got := metricValue(t, r.Running, "kurz_redirect_previews_total", `status="200"`); got != 2 {
		t.Errorf("previews answered 200: metric %v, want 2", got)
	}
	if got := metricValue(t, r.Running, "kurz_redirect_requests_total"); got != 1 {
		t.Errorf("redirect requests metric %v, want 1 (the disabled link's redirect; previews are not counted there)", got)
	}
}
