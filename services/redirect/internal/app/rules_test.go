//go:build integration

package app

import (
	"context"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"testing"
	"time"

	"kurz.dev/pkg/linkcache"
)

// Redirect rules and variants (issue #20 point 2) as the redirect serves
// them from PostgreSQL, Redis and L1, and with the other link features.

// germanRules sends German speakers elsewhere and splits the rest.
const germanRules = `{"r":[{"n":"german","if":[{"l":["de"]}],"u":"https://example.com/de"}],
	"v":[{"n":"a","u":"https://example.com/a","w":1},{"n":"b","u":"https://example.com/b","w":1}]}`

// setRules writes a link's rules column.
func (f *fixture) setRules(code, rules string) {
	f.t.Helper()
	if _, err := f.db.Exec(context.Background(), `UPDATE links SET rules = $2 WHERE code = $1`, code, rules); err != nil {
		f.t.Fatal(err)
	}
}

// TestRulesFromEveryTier: the rules stored with a link apply whichever tier
// answers (db, cache, l1), and the Redis entry filled from PostgreSQL
// carries them.
func TestRulesFromEveryTier(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	f.insertLink(code, "https://example.com/", features{})
	f.setRules(code, germanRules)
	r := start(t, nil, hooks{})
	sources := map[string]bool{}
	for range 2 { // db and cache, then l1 and l1
		german := get(t, r.HTTP, "/"+code, "Accept-Language", "de-CH, en;q=0.5", "User-Agent", "kurz-test/1.0")
		other := get(t, r.HTTP, "/"+code, "Accept-Language", "en, de;q=0", "User-Agent", "kurz-test/1.0")
		sources[german.Header.Get("X-Source")], sources[other.Header.Get("X-Source")] = true, true
		if german.Header.Get("Location") != "https://example.com/de" {
			t.Fatalf("German visitor from %s: Location %q", german.Header.Get("X-Source"), german.Header.Get("Location"))
		}
		if loc := other.Header.Get("Location"); loc != "https://example.com/a" && loc != "https://example.com/b" {
			t.Fatalf("other visitor from %s: Location %q, want a variant", other.Header.Get("X-Source"), loc)
		}
		if cc := german.Header.Get("Cache-Control"); cc != "private, max-age=0" {
			t.Fatalf("Cache-Control %q", cc)
		}
	}
	if !sources["db"] || !sources["cache"] || !sources["l1"] {
		t.Fatalf("answers came from %v, want db, cache and l1", sources)
	}
	e, found, err := linkcache.Get(context.Background(), f.rdb, code)
	if err != nil || !found || !e.Rules.HasRules() || !e.Rules.HasVariants() {
		t.Fatalf("Redis entry filled from PostgreSQL: found=%v err=%v rules=%+v", found, err, e.Rules)
	}
}

// TestRulesAfterPasswordAndVisits: a protected link asks for its password
// before any rule applies (the form, whatever the visitor), the right
// password leads where the rules say; a visit-limited link spends a visit
// per redirect, rules or not, and answers 410 once spent; an expired link
// answers 410.
func TestRulesAfterPasswordAndVisits(t *testing.T) {
	f := newFixture(t)
	locked, limited := f.code(), f.code()
	f.insertLink(locked, "https://example.com/locked", features{passwordHash: testHash(t)})
	f.setRules(locked, germanRules)
	f.insertLink(limited, "https://example.com/limited", features{maxVisits: 2})
	f.setRules(limited, germanRules)
	r := start(t, map[string]string{"KURZ_REDIRECT_FORM_SECRET": testFormSecret}, hooks{})
	german := []string{"Accept-Language", "de", "User-Agent", "kurz-test/1.0"}

	resp, fm := openForm(t, r.HTTP, locked, german...)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Location") != "" {
		t.Fatalf("protected link with rules: %d Location %q, want the form", resp.StatusCode, resp.Header.Get("Location"))
	}
	right := submit(t, r.HTTP, locked, fm.cookie, fm.token, testPassword, german...)
	if right.StatusCode != http.StatusSeeOther || right.Header.Get("Location") != "https://example.com/de" || right.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("right password: %d Location %q Cache-Control %q, want 303 to the German rule's URL, no-store",
			right.StatusCode, right.Header.Get("Location"), right.Header.Get("Cache-Control"))
	}

	for i := range 2 {
		resp := get(t, r.HTTP, "/"+limited, german...)
		if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "https://example.com/de" || resp.Header.Get("Cache-Control") != "no-store" {
			t.Fatalf("visit %d: %d Location %q Cache-Control %q", i+1, resp.StatusCode, resp.Header.Get("Location"), resp.Header.Get("Cache-Control"))
		}
	}
	if resp := get(t, r.HTTP, "/"+limited, german...); resp.StatusCode != http.StatusGone {
		t.Fatalf("third visit of a 2-visit link with rules: %d, want 410", resp.StatusCode)
	}

	// An expired link answers 410 whatever its rules say.
	expired := f.code()
	f.insertLink(expired, "https://example.com/expired", features{expires: time.Now().Add(-time.Minute)})
	f.setRules(expired, germanRules)
	if resp := get(t, r.HTTP, "/"+expired, german...); resp.StatusCode != http.StatusGone || resp.Header.Get("Location") != "" {
		t.Fatalf("expired link with rules: %d Location %q, want 410", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// TestQueryRulesAfterPassword: the form of a protected link posts to its
// code with the query the visitor's link carried, so a query rule holds
// after the right password as it would on the link unprotected.
func TestQueryRulesAfterPassword(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	f.insertLink(code, "https://example.com/locked", features{passwordHash: testHash(t)})
	f.setRules(code, `{"r":[{"n":"news","if":[{"q":{"p":"utm_source","v":"news letter"}}],"u":"https://example.com/news"}]}`)
	r := start(t, map[string]string{"KURZ_REDIRECT_FORM_SECRET": testFormSecret}, hooks{})

	resp, fm := openForm(t, r.HTTP, code+"?utm_source=news+letter&x=%3Cb%3E")
	m := regexp.MustCompile(`<form method="post" action="([^"]*)">`).FindStringSubmatch(resp.Header.Get("X-Test-Body"))
	if m == nil {
		t.Fatalf("no form action in %q", resp.Header.Get("X-Test-Body"))
	}
	action := html.UnescapeString(m[1])
	if want := "/" + code + "?utm_source=news+letter&x=%3Cb%3E"; action != want {
		t.Fatalf("form action %q, want %q", action, want)
	}
	body := url.Values{"token": {fm.token}, "password": {testPassword}}.Encode()
	right := post(t, r.HTTP+action, "application/x-www-form-urlencoded", body, fm.cookie)
	if right.StatusCode != http.StatusSeeOther || right.Header.Get("Location") != "https://example.com/news" {
		t.Fatalf("right password from a utm_source=news+letter link: %d Location %q, want 303 to the rule's URL",
			right.StatusCode, right.Header.Get("Location"))
	}
}

// TestRulesClicksCarryRuleAndVariant: the click of a rule's or a variant's
// redirect names it on the stream.
func TestRulesClicksCarryRuleAndVariant(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	f.insertLink(code, "https://example.com/", features{})
	f.setRules(code, germanRules)
	since := time.Now().Add(-time.Second)
	r := start(t, map[string]string{"KURZ_REDIRECT_CLICK_FLUSH_INTERVAL": "20ms"}, hooks{})
	get(t, r.HTTP, "/"+code, "Accept-Language", "de", "User-Agent", "kurz-test/1.0")
	variant := get(t, r.HTTP, "/"+code, "Accept-Language", "fr", "User-Agent", "kurz-test/1.0").Header.Get("Location")
	var rules, variants []string
	await(t, "two click events", 10*time.Second, func() bool {
		events, _ := streamEvents(t, f.rdb, r.cfg.Streams.Shards, code, since)
		rules, variants = nil, nil
		for _, es := range events {
			for _, e := range es {
				rules, variants = append(rules, e.Rule), append(variants, e.Variant)
			}
		}
		return len(rules) == 2
	})
	wantVariant := variant[len("https://example.com/"):]
	if !(rules[0] == "german" && variants[0] == "" && rules[1] == "" && variants[1] == wantVariant) &&
		!(rules[1] == "german" && variants[1] == "" && rules[0] == "" && variants[0] == wantVariant) {
		t.Fatalf("clicks carry rules %q and variants %q; want german, then variant %s", rules, variants, wantVariant)
	}
}
