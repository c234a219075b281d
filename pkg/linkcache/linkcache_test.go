package linkcache

import (
	"testing"
	"time"
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
	for _, bad := range []string{"", "{", `{"s":"active"}`, `{"s":"maybe"}`} {
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
