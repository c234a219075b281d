//go:build integration

package redirector

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkrules"
)

// A link whose destination is the host and port it is asked on would send
// the client back for ever: 508, no Location, no click, no visit spent,
// whichever of the link's URL, device target or rule chose it. The same
// link asked on another name redirects as usual.
func TestRedirectBackToItsOwnHostIsRefused(t *testing.T) {
	back := &linkrules.Set{Rules: []linkrules.Rule{
		{Name: "debug", If: []linkrules.Condition{{Query: &linkrules.Query{Param: "debug"}}}, URL: "http://kurz.test:8787/elsewhere"},
	}}
	if err := back.Compile(); err != nil {
		t.Fatal(err)
	}
	clicks := &keptClicks{}
	mux, rdb := serveRedis(t, benchConfig(), clicks, nil, map[string]linkcache.Entry{
		"self":    {State: linkcache.Active, URL: "http://Kurz.Test:8787/self", MaxVisits: 5},
		"device":  {State: linkcache.Active, URL: "https://example.com/", Targets: &linkcache.Targets{IOS: "http://kurz.test:8787/app"}},
		"ruled":   {State: linkcache.Active, URL: "https://example.com/", Rules: back},
		"otherpt": {State: linkcache.Active, URL: "http://kurz.test:9999/self", MaxVisits: 5},
	})
	ask := func(method, host, target, ua string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, target, nil)
		req.Host = host
		req.RemoteAddr = "198.51.100.1:1234"
		req.Header.Set("User-Agent", ua)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		return w
	}
	for _, c := range []struct{ method, host, target, ua string }{
		{http.MethodGet, "kurz.test:8787", "/self", windows},
		{http.MethodGet, "kurz.test.:8787", "/self", windows},
		{http.MethodHead, "kurz.test:8787", "/self", windows},
		{http.MethodGet, "kurz.test:8787", "/self", "Slackbot-LinkExpanding 1.0"},
		{http.MethodGet, "kurz.test:8787", "/device", iPhone},
		{http.MethodGet, "kurz.test:8787", "/ruled?debug", windows},
	} {
		w := ask(c.method, c.host, c.target, c.ua)
		if w.Code != http.StatusLoopDetected || w.Header().Get("Location") != "" {
			t.Errorf("%s %s%s (%s): %d to %q, want 508 without Location", c.method, c.host, c.target, c.ua, w.Code, w.Header().Get("Location"))
		}
	}
	if n := len(clicks.events); n != 0 {
		t.Errorf("%d clicks recorded for loops, want none", n)
	}
	if n, err := rdb.Get(context.Background(), linkcache.VisitsKey("self")).Int64(); !errors.Is(err, redis.Nil) {
		t.Errorf("the looping link's visit counter is %d (err %v), want none spent", n, err)
	}

	// Not loops: another port, another name, another device or no rule.
	for _, c := range []struct{ host, target, ua string }{
		{"kurz.test:8787", "/otherpt", windows},
		{"other.test:8787", "/self", windows},
		{"kurz.test:8787", "/device", windows},
		{"kurz.test:8787", "/ruled", windows},
	} {
		if w := ask(http.MethodGet, c.host, c.target, c.ua); w.Code != http.StatusFound {
			t.Errorf("GET %s%s (%s): %d, want 302", c.host, c.target, c.ua, w.Code)
		}
	}
	if n := len(clicks.events); n != 4 {
		t.Errorf("%d clicks recorded for 4 redirects", n)
	}
}
