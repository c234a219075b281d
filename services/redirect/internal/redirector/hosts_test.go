package redirector

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/testkit/servertest"
)

func TestHostsRoute(t *testing.T) {
	h := NewHosts([]string{"kurz.test", "127.0.0.1"})
	// kurz.test held by a tenant (a shortener whose own hosts were not
	// configured as the redirect's) does not take the default host.
	h.SetDomains(map[string]string{"go.acme.test": "acme", "kurz.test": "mallory"})
	for _, c := range []struct {
		host, domain, tenant string
		ok                   bool
	}{
		{"kurz.test", "", "", true},
		{"KURZ.test:443", "", "", true},
		{"127.0.0.1:8787", "", "", true},
		{"go.acme.test", "go.acme.test", "acme", true},
		{"Go.Acme.Test:8787", "go.acme.test", "acme", true},
		{"other.test", "", "", false},
		{"", "", "", false},
	} {
		d, tenant, ok := h.Route(c.host)
		if d != c.domain || tenant != c.tenant || ok != c.ok {
			t.Errorf("Route(%q) = %q, %q, %v; want %q, %q, %v", c.host, d, tenant, ok, c.domain, c.tenant, c.ok)
		}
	}
	// Without default hosts, every other host is the default domain.
	open := NewHosts(nil)
	// Until the domains are first read, though, no host can be told from
	// a custom domain's: none serves the default domain's links.
	if d, _, ok := open.Route("go.acme.test"); ok || open.Loaded() {
		t.Errorf("Route before the domains were read = %q, %v (loaded %v); want no route", d, ok, open.Loaded())
	}
	open.SetDomains(map[string]string{"go.acme.test": "acme"})
	if d, _, ok := open.Route("anything.test"); d != "" || !ok {
		t.Errorf("Route without default hosts = %q, %v; want the default domain", d, ok)
	}
	if d, tenant, ok := open.Route("go.acme.test"); d != "go.acme.test" || tenant != "acme" || !ok {
		t.Errorf("Route of a custom domain without default hosts = %q, %q, %v", d, tenant, ok)
	}
	// Default hosts serve before the domains were read; others do not.
	listed := NewHosts([]string{"kurz.test"})
	if _, _, ok := listed.Route("kurz.test"); !ok {
		t.Error("a default host not served before the domains were read")
	}
	if _, _, ok := listed.Route("go.acme.test"); ok {
		t.Error("another host served before the domains were read")
	}
}

func TestForeignEntry(t *testing.T) {
	e := entryOf("acme")
	if got := foreign(e, ""); got.State != e.State {
		t.Error("the default domain refused a link")
	}
	if got := foreign(e, "acme"); got.State != e.State {
		t.Error("the holder's own link refused")
	}
	if got := foreign(e, "other"); got.URL != "" || got.State == e.State {
		t.Errorf("another tenant's link served: %+v", got)
	}
}

func entryOf(tenant string) linkcache.Entry {
	return linkcache.Entry{State: linkcache.Active, URL: "https://example.com/", Tenant: tenant}
}

// A request line naming a host (absolute-form) over a real connection is
// answered 400 before any route, whatever its Host header, so no route
// reads a host the Host header does not name; a request line with a path
// alone reaches the routes with the Host header's host.
func TestOriginFormRefusesARequestLineNamingAHost(t *testing.T) {
	var routed atomic.Int64
	var lastHost atomic.Value
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		routed.Add(1)
		lastHost.Store(r.Host)
		w.WriteHeader(http.StatusNoContent)
	})
	srv := httptest.NewServer(OriginForm(mux))
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	exchange := func(line string) servertest.RawResponse {
		t.Helper()
		got, err := servertest.RawExchange(addr, line+"\r\nHost: "+addr+"\r\nConnection: close\r\n\r\n", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	for _, line := range []string{
		"GET http://example.com/abcd HTTP/1.1",
		"GET http://" + addr + "/abcd HTTP/1.1", // the Host header's own name: the header is gone, nothing to compare
		"POST https://go.acme.test/abcd HTTP/1.1",
		"GET http:///abcd HTTP/1.1",
		"GET HTTP://EXAMPLE.COM/abcd+ HTTP/1.0",
	} {
		got := exchange(line)
		if got.Status != http.StatusBadRequest || !strings.Contains(got.Body, "names a host in its request line") ||
			got.Header.Get("Content-Security-Policy") != "default-src 'none'" {
			t.Errorf("%q: %d %q, want 400 and the page saying why", line, got.Status, got.Body)
		}
	}
	if n := routed.Load(); n != 0 {
		t.Errorf("%d requests naming a host reached the routes, want none", n)
	}
	if got := exchange("GET /abcd HTTP/1.1"); got.Status != http.StatusNoContent || routed.Load() != 1 || lastHost.Load() != addr {
		t.Errorf("a request line with a path alone: %d, routed %d times with host %v; want 204 routed once with host %s", got.Status, routed.Load(), lastHost.Load(), addr)
	}
}
