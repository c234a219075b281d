package codegen_test

import (
	"bytes"
	"testing"

	"kurz.dev/pkg/linkcode"
	"kurz.dev/services/shortener/internal/codegen"
)

// Candidates are 7 base62 characters, the same for the same key, tenant,
// URL and attempt, and different when any of them changes.
func TestFromURLCandidates(t *testing.T) {
	key := []byte("from-url-unit-test-code-key-0123456789")
	f, err := codegen.NewFromURL(key)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := codegen.NewFromURL(key)
	other, _ := codegen.NewFromURL([]byte("another-unit-test-code-key-0123456789a"))
	const url = "https://example.com/spring"
	c0 := f.Candidate("acme", url, 0)
	if len(c0) != 7 || !linkcode.Plausible(c0) {
		t.Fatalf("candidate %q: want 7 base62 characters", c0)
	}
	if got := again.Candidate("acme", url, 0); got != c0 {
		t.Errorf("the same inputs gave %q and %q", c0, got)
	}
	seen := map[string]string{c0: "first"}
	for name, code := range map[string]string{
		"next attempt": f.Candidate("acme", url, 1),
		"other tenant": f.Candidate("acme2", url, 0),
		"other url":    f.Candidate("acme", url+"2", 0),
		"other key":    other.Candidate("acme", url, 0),
		// The tenant's length is hashed too: "ab"+"c..." is not "a"+"bc...".
		"shifted boundary": f.Candidate("acmeh", "ttps://example.com/spring", 0),
	} {
		if prev, dup := seen[code]; dup {
			t.Errorf("%s gave %q, as %s did", name, code, prev)
		}
		seen[code] = name
	}
	if _, err := codegen.NewFromURL([]byte("short")); err == nil {
		t.Error("a short key was accepted")
	}
	if bytes.Equal(codegen.URLKey("", url), codegen.URLKey("go.example.com", url)) {
		t.Error("URLKey: one URL on two domains has one key")
	}
	if !bytes.Equal(codegen.URLKey("", url), codegen.URLKey("", url)) || bytes.Equal(codegen.URLKey("", url), codegen.URLKey("", url+"/")) || len(codegen.URLKey("", url)) != 32 {
		t.Error("URLKey is not a SHA-256 of the URL")
	}
}
