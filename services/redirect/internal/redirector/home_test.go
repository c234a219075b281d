package redirector

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The default domain's root redirects to the home URL, found or not; a
// custom domain's root, another host's, and every root without a home URL
// are a 404 page.
func TestHomeURL(t *testing.T) {
	hosts := NewHosts([]string{"kurz.test"})
	hosts.SetDomains(map[string]string{"go.acme.test": "acme"})
	serve := func(home, method, host string) *httptest.ResponseRecorder {
		h := &Handler{cfg: Config{HomeURL: home}, hosts: hosts}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /{$}", h.serveHome)
		w := httptest.NewRecorder()
		r := httptest.NewRequest(method, "/", nil)
		r.Host = host
		mux.ServeHTTP(w, r)
		return w
	}
	const home = "https://example.com/about?from=kurz"
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		w := serve(home, method, "KURZ.test:8787")
		if w.Code != http.StatusFound || w.Header().Get("Location") != home || w.Header().Get("Cache-Control") != "private, max-age=0" {
			t.Errorf("%s / on the default domain: %d %v; want 302 to %s", method, w.Code, w.Header(), home)
		}
	}
	// The root itself, under any query, would loop; a path on the same
	// host (a short link, say) does not.
	for _, loop := range []string{"https://kurz.test/", "http://KURZ.test?from=root"} {
		if w := serve(loop, http.MethodGet, "kurz.test"); w.Code != http.StatusLoopDetected || w.Header().Get("Location") != "" {
			t.Errorf("GET / on kurz.test with home %s: %d %v; want 508", loop, w.Code, w.Header())
		}
	}
	if w := serve("https://kurz.test/welcome", http.MethodGet, "kurz.test"); w.Code != http.StatusFound {
		t.Errorf("GET / with home https://kurz.test/welcome: %d; want 302", w.Code)
	}
	for _, c := range []struct{ home, host string }{{home, "go.acme.test"}, {home, "stray.test"}, {"", "kurz.test"}} {
		if w := serve(c.home, http.MethodGet, c.host); w.Code != http.StatusNotFound || w.Header().Get("Location") != "" {
			t.Errorf("GET / on %s with home %q: %d %v; want the 404 page", c.host, c.home, w.Code, w.Header())
		}
	}
}

func TestCheckHomeURL(t *testing.T) {
	for _, ok := range []string{"", "https://example.com/", "http://example.com:8080/a?b=c", "https://xn--bcher-kva.example/%C3%BC"} {
		if err := CheckHomeURL(ok); err != nil {
			t.Errorf("CheckHomeURL(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"example.com", "/about", "ftp://example.com/", "https://user:pw@example.com/", "https://", "https://example.com/ü",
		"https://example.com/" + strings.Repeat("a", maxHomeURL)} {
		if err := CheckHomeURL(bad); err == nil {
			t.Errorf("CheckHomeURL(%q) = nil, want an error", bad)
		}
	}
}
