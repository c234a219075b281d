package linkcode

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestSequentialMatchesTheNotes(t *testing.T) {
	// The notes: nextval 1 with blocks of 1,000 gives IDs 1000, 1001, ...
	for id, want := range map[int64]string{0: "1000000", 1000: "10000g8", 1001: "10000g9", 1002: "10000ga"} {
		got, err := Sequential(id)
		if err != nil || got != want {
			t.Errorf("Sequential(%d) = %q, %v; want %q", id, got, err, want)
		}
		back, ok := SequentialID(got)
		if !ok || back != id {
			t.Errorf("SequentialID(%q) = %d, %v; want %d", got, back, ok, id)
		}
	}
	last, err := Sequential(MaxSequentialID)
	if err != nil || last != "ZZZZZZZ" {
		t.Errorf("Sequential(max) = %q, %v; want ZZZZZZZ", last, err)
	}
	if _, err := Sequential(MaxSequentialID + 1); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("Sequential(max+1): got %v, want ErrOutOfRange", err)
	}
	for _, s := range []string{"abc", "0zzzzzz", "100000-", "12345678"} {
		if _, ok := SequentialID(s); ok {
			t.Errorf("SequentialID(%q) ok, want not a sequential code", s)
		}
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, n := range []int64{0, 1, 61, 62, 3843, 3844, SequentialOffset, 1<<63 - 1} {
		s := Encode(n)
		got, ok := Decode(s)
		if !ok || got != n {
			t.Errorf("Decode(Encode(%d)=%q) = %d, %v", n, s, got, ok)
		}
	}
	for _, s := range []string{"", "a-b", "zzzzzzzzzzzz", "ZZZZZZZZZZZ"} {
		if _, ok := Decode(s); ok {
			t.Errorf("Decode(%q) ok, want failure", s)
		}
	}
}

func TestRandomIsUniformAndSkipsBiasedBytes(t *testing.T) {
	// Bytes 248..255 would favour the first 8 characters under a plain
	// modulo; they must be skipped.
	src := bytes.NewReader(append(bytes.Repeat([]byte{255, 250, 248}, 6), bytes.Repeat([]byte{0, 61, 62, 247}, 8)...))
	got, err := Random(src, 8)
	if err != nil {
		t.Fatal(err)
	}
	if want := "0Z0Z0Z0Z"; got != want {
		t.Errorf("Random = %q, want %q (bytes >= 248 skipped, 62 -> '0', 247 -> 'Z')", got, want)
	}
	counts := map[rune]int{}
	for range 2000 {
		code, err := Random(nil, SequentialLength)
		if err != nil {
			t.Fatal(err)
		}
		if len(code) != SequentialLength || strings.Trim(code, Alphabet) != "" {
			t.Fatalf("Random = %q: want 7 base62 characters", code)
		}
		for _, c := range code {
			counts[c]++
		}
	}
	// 14,000 characters over 62 symbols: about 226 each; a biased or broken
	// generator leaves some far off.
	for _, c := range Alphabet {
		if n := counts[c]; n < 120 || n > 340 {
			t.Errorf("character %q drawn %d times of 14000; want about 226", c, n)
		}
	}
}

func TestPlausibleAndAlias(t *testing.T) {
	tests := map[string]struct {
		in        string
		plausible bool
		aliasOK   bool
	}{
		"sequential":         {"10000g8", true, true},
		"alias with dash":    {"my-launch_2", true, true},
		"too short":          {"abc", false, false},
		"too long":           {strings.Repeat("a", MaxLength+1), false, false},
		"longest":            {strings.Repeat("a", MaxLength), true, true},
		"dot":                {"favicon.ico", false, false},
		"slash":              {"a/bcd", false, false},
		"unicode":            {"caféé", false, false},
		"reserved":           {"healthz", true, false},
		"reserved any case":  {"Metrics", true, false},
		"leading dash":       {"-abcd", true, false},
		"trailing underline": {"abcd_", true, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := Plausible(tc.in); got != tc.plausible {
				t.Errorf("Plausible(%q) = %v, want %v", tc.in, got, tc.plausible)
			}
			if got := AliasProblem(tc.in) == ""; got != tc.aliasOK {
				t.Errorf("AliasProblem(%q) = %q, want ok=%v", tc.in, AliasProblem(tc.in), tc.aliasOK)
			}
		})
	}
}
