//go:build integration

package redirector

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"kurz.dev/pkg/linkcache"
)

// A suspended tenant's links answer as a disabled link does (410, the same
// page, nothing cached), from L1 too, record no click and spend no visit;
// another tenant's links redirect throughout, and a resume (the set
// without the tenant) restores the redirect.
func TestSuspendedTenantsLinksAnswerGone(t *testing.T) {
	clicks := &keptClicks{}
	suspended := &Suspended{}
	suspended.Set(map[string]struct{}{})
	entries := map[string]linkcache.Entry{
		"abuse01": {State: linkcache.Active, URL: "https://example.com/phish", Tenant: "abuser"},
		"abuse02": {State: linkcache.Active, URL: "https://example.com/limited", Tenant: "abuser", MaxVisits: 5},
		"other01": {State: linkcache.Active, URL: "https://example.com/fine", Tenant: "t"},
		"gone001": {State: linkcache.Gone, Tenant: "t"},
	}
	mux, rdb := serveSuspended(t, benchConfig(), clicks, nil, suspended, entries)
	get := func(method, code string) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest(method, "/"+code, nil)
		req.Host = shortHost
		req.Header.Set("User-Agent", windows)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		return w
	}
	for range 2 { // from Redis, then from L1
		for _, code := range []string{"abuse01", "abuse02", "other01"} {
			if w := get(http.MethodGet, code); w.Code != http.StatusFound {
				t.Fatalf("%s before the suspension: %d, want 302", code, w.Code)
			}
		}
	}
	gone := get(http.MethodGet, "gone001")
	ctx := context.Background()
	visits := func() string {
		v, _ := rdb.Get(ctx, linkcache.VisitsKey("abuse02")).Result()
		return v
	}
	clicksBefore, visitsBefore := len(clicks.events), visits()

	suspended.Set(map[string]struct{}{"abuser": {}})
	for _, code := range []string{"abuse01", "abuse02"} {
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			w := get(method, code)
			if w.Code != http.StatusGone || w.Header().Get("X-Source") != "l1" || w.Header().Get("Location") != "" {
				t.Errorf("%s %s of a suspended tenant: %d from %q, Location %q; want 410 from l1 without Location",
					method, code, w.Code, w.Header().Get("X-Source"), w.Header().Get("Location"))
			}
			if method == http.MethodGet && (w.Body.String() != gone.Body.String() || w.Header().Get("Cache-Control") != gone.Header().Get("Cache-Control")) {
				t.Errorf("%s: page %q (%s), want a disabled link's %q (%s)", code, w.Body, w.Header().Get("Cache-Control"),
					gone.Body, gone.Header().Get("Cache-Control"))
			}
		}
	}
	if n, v := len(clicks.events), visits(); n != clicksBefore || v != visitsBefore {
		t.Errorf("while suspended: %d clicks recorded (had %d), visits %q (had %q); want neither", n, clicksBefore, v, visitsBefore)
	}
	if w := get(http.MethodGet, "other01"); w.Code != http.StatusFound {
		t.Errorf("another tenant's link while one is suspended: %d, want 302", w.Code)
	}

	suspended.Set(map[string]struct{}{})
	if w := get(http.MethodGet, "abuse01"); w.Code != http.StatusFound || w.Header().Get("Location") != "https://example.com/phish" {
		t.Errorf("after resume: %d to %q, want 302 to the link's URL", w.Code, w.Header().Get("Location"))
	}
	if len(clicks.events) != clicksBefore+2 { // abuse01 and other01
		t.Errorf("after resume: %d clicks, want %d", len(clicks.events), clicksBefore+2)
	}
}
