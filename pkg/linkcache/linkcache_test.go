package linkcache

import (
	"errors"
	"testing"
	"time"

	"kurz.dev/pkg/linkrules"
)

func TestEntryRoundTrip(t *testing.T) {
	for _, e := range []Entry{
		{State: Active, URL: "https://example.com/a?b=1", Tenant: "acme", Status: 301, ExpiresAtMs: 1790000000000},
		{State: Gone, Tenant: "acme"},
		{State: Missing},
	} {
		got, err := Unmarshal(Marshal(e))
		if err != nil || got != e {
			t.Errorf("Unmarshal(Marshal(%+v)) = %+v, %v", e, got, err)
		}
	}
	for _, bad := range []string{"", "{", `{"v":2,"s":"active"}`, `{"v":2,"s":"maybe"}`} {
		if _, err := Unmarshal(bad); err == nil {
			t.Errorf("Unmarshal(%q): want an error", bad)
		}
	}
}

func TestExpired(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	if (Entry{State: Active, URL: "x"}).Expired(now) {
		t.Error("no expiry reported as expired")
	}
	if !(Entry{State: Active, URL: "x", ExpiresAtMs: 1_000_000}).Expired(now) {
		t.Error("expiry at now not reported as expired")
	}
}

func TestPlainEntryHasNoRulesField(t *testing.T) {
	const want = `{"v":2,"s":"active","u":"https://example.com/","t":"acme"}`
	if got := Marshal(Entry{State: Active, URL: "https://example.com/", Tenant: "acme"}); got != want {
		t.Fatalf("plain entry encodes as %s, want %s", got, want)
	}
}

func TestRulesRoundTripCompiled(t *testing.T) {
	rules := &linkrules.Set{Rules: []linkrules.Rule{{Name: "debug", If: []linkrules.Condition{{Query: &linkrules.Query{Param: "debug"}}}, URL: "https://example.com/debug"}}}
	if err := rules.Compile(); err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(Marshal(Entry{State: Active, URL: "https://example.com/", Rules: rules}))
	if err != nil {
		t.Fatal(err)
	}
	req := linkrules.Request{RawQuery: "debug=1"}
	if u, _, ok := got.Rules.Match(&req); !ok || u != "https://example.com/debug" {
		t.Fatalf("decoded rules matched %q, %v", u, ok)
	}
	if _, err := Unmarshal(`{"v":2,"s":"active","u":"https://example.com/","g":{"v":[{"n":"a","u":"https://example.com/","w":-1}]}}`); err == nil {
		t.Fatal("an entry with a negative weight decoded")
	}
}

// An entry of another format version (none: before versions, or a build
// that knew fewer fields; or a newer one) does not decode as one of ours.
func TestOtherFormatVersionsAreNotOurs(t *testing.T) {
	for _, s := range []string{
		`{"s":"active","u":"https://example.com/","t":"acme"}`,
		`{"v":1,"s":"active","u":"https://example.com/","t":"acme"}`,
		`{"v":3,"s":"active","u":"https://example.com/","t":"acme","z":1}`,
	} {
		if _, err := Unmarshal(s); !errors.Is(err, ErrOtherFormat) {
			t.Errorf("Unmarshal(%s): %v; want ErrOtherFormat", s, err)
		}
	}
}
