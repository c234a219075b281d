package codegen_test

import (
	"bytes"
	"errors"
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

// FreeCandidate finds the first free candidate after a run of taken ones
// (a tenant's earlier links of the URL), however long the run, in at most
// FromURLLooks looks of at most 40 candidates each; a lone free candidate
// past the run is not needed, and with every candidate taken there is
// none.
func TestFreeCandidateFindsTheEndOfARunInFewLooks(t *testing.T) {
	for _, run := range []int{0, 1, 7, 8, 9, 15, 16, 17, 100, 1000, 33 * 33, 123457, 1 << 20, codegen.FromURLCandidates / 3,
		codegen.FromURLCandidates/2 + 5, codegen.FromURLCandidates - 2, codegen.FromURLCandidates - 1} {
		for _, from := range []int{0, 1, run / 2, run} {
			if from > run {
				continue
			}
			looks, widest := 0, 0
			got, ok, err := codegen.FreeCandidate(from, func(attempts []int) ([]bool, error) {
				looks++
				widest = max(widest, len(attempts))
				held := make([]bool, len(attempts))
				for i, a := range attempts {
					if a < from || a >= codegen.FromURLCandidates {
						t.Fatalf("run %d from %d: candidate %d looked at", run, from, a)
					}
					held[i] = a < run
				}
				return held, nil
			})
			if err != nil || !ok || got != run {
				t.Errorf("run %d from %d: %d, %v, %v; want candidate %d", run, from, got, ok, err, run)
			}
			if looks > codegen.FromURLLooks || widest > 40 {
				t.Errorf("run %d from %d: %d looks of up to %d candidates, want at most %d of up to 40", run, from, looks, widest, codegen.FromURLLooks)
			}
		}
	}

	all := func(attempts []int) ([]bool, error) {
		held := make([]bool, len(attempts))
		for i := range held {
			held[i] = true
		}
		return held, nil
	}
	if got, ok, err := codegen.FreeCandidate(0, all); ok || err != nil {
		t.Errorf("every candidate taken: %d, %v, %v; want none", got, ok, err)
	}
	if _, ok, _ := codegen.FreeCandidate(codegen.FromURLCandidates, all); ok {
		t.Error("from past the last candidate: found one")
	}
	broken := errors.New("connection refused")
	if _, _, err := codegen.FreeCandidate(0, func([]int) ([]bool, error) { return nil, broken }); !errors.Is(err, broken) {
		t.Errorf("a failed look: %v, want its error", err)
	}
}
