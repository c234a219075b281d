package linkcode

import (
	"math"
	"math/big"
	"strings"
	"testing"
)

// FuzzParseCode checks everything that reads a code from outside (a request
// path, an alias, a sequential code) against independent definitions: Decode
// agrees with math/big's base 62 (the same digit order) on every string of
// 1 to 11 alphabet characters whose value fits an int64 and refuses the
// rest; an accepted numeral re-encodes to itself without leading zeros;
// SequentialID accepts exactly the 7-character codes Sequential issues;
// Plausible and AliasProblem keep to their charset, length and edge rules.
// The seed corpus is in testdata/fuzz/FuzzParseCode.
func FuzzParseCode(f *testing.F) {
	for _, s := range []string{
		"", "0", "00", "1000000", "10000g8", "ZZZZZZZ", "0zzzzzz", "100000-", "12345678",
		"aZl8N0y58M7", "aZl8N0y58M8", "zzzzzzzzzzz", "ZZZZZZZZZZZ", "+abc", "-1", "my-launch_2",
		"-abcd", "abcd_", "healthz", "HeAlThZ", "favicon.ico", "caf\u00e9s", "a\x00bcd", strings.Repeat("a", MaxLength+1),
	} {
		f.Add(s)
	}
	maxInt := big.NewInt(math.MaxInt64)
	f.Fuzz(func(t *testing.T, s string) {
		base62 := s != "" && strings.Trim(s, Alphabet) == ""
		n, ok := Decode(s)
		want, wantOK := new(big.Int), false
		if base62 && len(s) <= 11 {
			if _, parsed := want.SetString(s, 62); !parsed {
				t.Fatalf("math/big cannot read the base62 string %q", s)
			}
			wantOK = want.Cmp(maxInt) <= 0
		}
		if ok != wantOK || ok && n != want.Int64() {
			t.Fatalf("Decode(%q) = %d, %v; want %s, %v", s, n, ok, want, wantOK)
		}
		if ok {
			if n < 0 {
				t.Fatalf("Decode(%q) = %d: negative", s, n)
			}
			canonical := strings.TrimLeft(s, "0")
			if canonical == "" {
				canonical = "0"
			}
			if got := Encode(n); got != canonical {
				t.Fatalf("Encode(Decode(%q)) = %q, want %q", s, got, canonical)
			}
		}

		id, seqOK := SequentialID(s)
		wantSeq := ok && len(s) == SequentialLength && n >= SequentialOffset
		if seqOK != wantSeq {
			t.Fatalf("SequentialID(%q) ok = %v, want %v", s, seqOK, wantSeq)
		}
		if seqOK {
			if id < 0 || id > MaxSequentialID {
				t.Fatalf("SequentialID(%q) = %d: outside 0..MaxSequentialID", s, id)
			}
			if back, err := Sequential(id); err != nil || back != s {
				t.Fatalf("Sequential(SequentialID(%q)) = %q, %v", s, back, err)
			}
		}

		plausible := Plausible(s)
		wantPlausible := len(s) >= MinLength && len(s) <= MaxLength && strings.Trim(s, Alphabet+"-_") == ""
		if plausible != wantPlausible {
			t.Fatalf("Plausible(%q) = %v, want %v", s, plausible, wantPlausible)
		}
		if seqOK && !plausible {
			t.Fatalf("sequential code %q is not Plausible", s)
		}
		problem := AliasProblem(s)
		aliasOK := plausible && strings.ContainsRune(Alphabet, rune(s[0])) &&
			strings.ContainsRune(Alphabet, rune(s[len(s)-1])) && !Reserved(s)
		if (problem == "") != aliasOK {
			t.Fatalf("AliasProblem(%q) = %q, want ok = %v", s, problem, aliasOK)
		}
		if plausible && Reserved(s) != Reserved(strings.ToUpper(s)) {
			t.Fatalf("Reserved(%q) depends on letter case", s)
		}
	})
}

// FuzzEncode checks the writing side: Encode yields the canonical base62
// numeral of every non-negative int64 and Decode reads it back; Sequential
// yields a 7-character code for exactly the IDs 0..MaxSequentialID, and
// SequentialID returns the ID. The seed corpus is in testdata/fuzz/FuzzEncode.
func FuzzEncode(f *testing.F) {
	for _, n := range []int64{
		0, 1, 61, 62, 1000, SequentialOffset - 1, SequentialOffset, MaxSequentialID, MaxSequentialID + 1,
		math.MaxInt64, -1, math.MinInt64,
	} {
		f.Add(n)
	}
	f.Fuzz(func(t *testing.T, n int64) {
		if n >= 0 {
			s := Encode(n)
			if s == "" || len(s) > 11 || strings.Trim(s, Alphabet) != "" || len(s) > 1 && s[0] == '0' {
				t.Fatalf("Encode(%d) = %q: not a canonical base62 numeral", n, s)
			}
			if want := big.NewInt(n).Text(62); s != want {
				t.Fatalf("Encode(%d) = %q, want %q", n, s, want)
			}
			if back, ok := Decode(s); !ok || back != n {
				t.Fatalf("Decode(Encode(%d) = %q) = %d, %v", n, s, back, ok)
			}
		}
		code, err := Sequential(n)
		if inRange := n >= 0 && n <= MaxSequentialID; (err == nil) != inRange {
			t.Fatalf("Sequential(%d) = %q, %v; want an error iff outside 0..MaxSequentialID", n, code, err)
		}
		if err != nil {
			return
		}
		if len(code) != SequentialLength || !Plausible(code) {
			t.Fatalf("Sequential(%d) = %q: want %d plausible characters", n, code, SequentialLength)
		}
		if id, ok := SequentialID(code); !ok || id != n {
			t.Fatalf("SequentialID(Sequential(%d) = %q) = %d, %v", n, code, id, ok)
		}
	})
}
