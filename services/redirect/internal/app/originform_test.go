//go:build integration

package app

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/testkit/servertest"
)

// A request line naming a host (absolute-form) is refused with 400 on the
// service's own listener, whichever host it names, before any route: routed
// on that host (Go's server drops the Host header for it), the request of a
// link to example.com named as example.com answered 508 where the same
// request with a path alone redirects, and a cache keyed on the Host header
// could keep one host's answer for another.
func TestRequestLineNamingAHostIsRefused(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	const target = "https://example.com/absolute-form"
	f.insert(code, "absform", target, 0, nil, false)
	r := start(t, nil, hooks{})
	addr := strings.TrimPrefix(r.HTTP, "http://")
	ask := func(requestTarget string) servertest.RawResponse {
		t.Helper()
		got, err := servertest.RawExchange(addr, "GET "+requestTarget+" HTTP/1.1\r\nHost: "+addr+"\r\nConnection: close\r\n\r\n", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := ask("/" + code); got.Status != http.StatusFound || got.Header.Get("Location") != target {
		t.Fatalf("GET /%s: %d to %q, want 302 to %s", code, got.Status, got.Header.Get("Location"), target)
	}
	for _, requestTarget := range []string{"http://example.com/" + code, "http://" + addr + "/" + code, "https://go.acme.test/" + code + "+", "http://" + addr + "/"} {
		if got := ask(requestTarget); got.Status != http.StatusBadRequest || got.Header.Get("Location") != "" || got.Header.Get("X-Source") != "" {
			t.Errorf("GET %s with Host %s: %d (Location %q, X-Source %q), want 400 before any lookup", requestTarget, addr, got.Status, got.Header.Get("Location"), got.Header.Get("X-Source"))
		}
	}
}
