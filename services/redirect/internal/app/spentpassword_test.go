//go:build integration

package app

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/testkit/limitertest"
)

// A visit-limited password link whose visits are spent answers a password
// attempt 410, as its GET, wrong password or right, before the limiter is
// asked or the password checked: a form kept from before its last visit
// no longer tells the right password from a wrong one (410 against 401),
// nor costs an Argon2 check.
func TestSpentLinkAnswersGoneBeforeThePassword(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	const target = "https://example.com/spent-once"
	f.insertLink(code, target, features{passwordHash: testHash(t), maxVisits: 1})
	lim := limitertest.Start(t, limitertest.AllowAll)
	r := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.Addr(), "KURZ_REDIRECT_FORM_SECRET": testFormSecret}, hooks{})

	_, fm := openForm(t, r.HTTP, code)
	if resp := submit(t, r.HTTP, code, fm.cookie, fm.token, testPassword); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the one visit, right password: %d, want 303", resp.StatusCode)
	}
	if resp := get(t, r.HTTP, "/"+code); resp.StatusCode != http.StatusGone {
		t.Fatalf("GET of the spent link: %d, want 410", resp.StatusCode)
	}
	before := len(lim.Calls())
	// The form of the first visit, kept in another tab.
	for _, password := range []string{"not the password", testPassword} {
		resp := submit(t, r.HTTP, code, fm.cookie, fm.token, password)
		if body := resp.Header.Get("X-Test-Body"); resp.StatusCode != http.StatusGone || resp.Header.Get("Location") != "" || strings.Contains(body, "<form") {
			t.Errorf("password %q on the spent link: %d, Location %q; want 410 with the gone page: %q", password, resp.StatusCode, resp.Header.Get("Location"), body)
		}
	}
	if calls := lim.Calls()[before:]; len(calls) != 0 {
		t.Errorf("attempts at the spent link asked the limiter %d times (%v), want none", len(calls), calls)
	}
	if got, err := f.rdb.Get(context.Background(), linkcache.VisitsKey(code)).Int64(); err != nil || got != 1 {
		t.Errorf("visit counter %d (%v) after the refused attempts, want 1", got, err)
	}
}
