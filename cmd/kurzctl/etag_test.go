//go:build integration

package main

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// --if-match changes or deletes a link only while it has the etag given:
// a stale one exits 1, saying the link changed, and changes nothing.
func TestIfMatchGuardsAChange(t *testing.T) {
	gw := startGateway(t, stack.Limiter)
	_, c := tenantWithKey(t, newCtl(t, gw), "free")
	code := strings.TrimSpace(c.ok("links", "create", "https://example.com/guarded", "-q"))
	first := field(t, c.ok("links", "get", code), "etag")

	out := c.ok("links", "update", code, "--disable", "--if-match", first)
	second := field(t, out, "etag")
	if field(t, out, "disabled") != "yes" || second == first {
		t.Fatalf("update --if-match with the current etag:\n%s", out)
	}
	for _, args := range [][]string{
		{"links", "update", code, "--enable", "--if-match", first},
		{"links", "delete", code, "--if-match", `"` + first + `"`},
	} {
		if r := c.run(args...); r.code != exitError || !strings.Contains(r.stderr, "changed since you read it") {
			t.Errorf("%v with a stale etag: %v; want exit %d saying the link changed", args, r, exitError)
		}
	}
	if got := field(t, c.ok("links", "get", code), "disabled"); got != "yes" {
		t.Errorf("after the refused changes: disabled %q, want yes", got)
	}
	c.ok("links", "delete", code, "--if-match", second)
}

// links update's device flags keep the targets they do not name as the
// link has them: a target another client set between kurzctl's read and
// its change is kept (the change is refused for the state read, and
// kurzctl reads again), not overwritten with what kurzctl read.
func TestDeviceFlagsKeepAConcurrentChange(t *testing.T) {
	gw := startGateway(t, stack.Limiter)
	_, c := tenantWithKey(t, newCtl(t, gw), "free")
	code := strings.TrimSpace(c.ok("links", "create", "https://example.com/apps", "--android", "https://example.com/android", "-q"))

	// A proxy that, before kurzctl's first PATCH, lets another client set
	// the desktop target.
	target, err := url.Parse(gw.url)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	var once sync.Once
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPatch {
			once.Do(func() {
				req, err := http.NewRequest(http.MethodPatch, gw.url+"/v1/links/"+code, strings.NewReader(
					`{"deviceTargets": {"androidUrl": "https://example.com/android", "desktopUrl": "https://example.com/desktop"}}`))
				if err != nil {
					t.Error(err)
					return
				}
				req.Header.Set("Authorization", "Bearer "+c.env["KURZ_API_KEY"])
				resp, err := http.DefaultClient.Do(req)
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Errorf("the other client's change: %v, %v", resp, err)
				}
				if resp != nil {
					resp.Body.Close()
				}
			})
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	via := c.withKey(c.env["KURZ_API_KEY"])
	via.env["KURZ_URL"] = proxy.URL

	out := via.ok("links", "update", code, "--ios", "https://example.com/ios")
	for name, want := range map[string]string{
		"ios url": "https://example.com/ios", "android url": "https://example.com/android", "desktop url": "https://example.com/desktop",
	} {
		if got := field(t, out, name); got != want {
			t.Errorf("after the update: %s = %q, want %q", name, got, want)
		}
	}
}
