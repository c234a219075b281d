package textcut_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"kurz.dev/pkg/textcut"
)

func TestPrefix(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{
		{"", 3, ""},
		{"abc", 3, "abc"},
		{"abcd", 3, "abc"},
		{"abc", 0, ""},
		{"abc", -1, ""},
		{"aé", 2, "a"},           // é is 2 bytes: not cut in half
		{"aé", 3, "aé"},          // exactly
		{"a€b", 3, "a"},          // € is 3 bytes
		{"a€b", 4, "a€"},         // at its end
		{"a😀b", 4, "a"},          // 4 bytes, cut after 3
		{"😀", 3, ""},             // nothing whole fits
		{"a\xffbc", 3, "a\xffb"}, // invalid bytes before the cut kept
		{"ab\xff", 2, "ab"},
		{"a\xe2\x82c", 3, "a"},        // a truncated sequence in the input, at the cut
		{"a\xe2\x82", 3, "a\xe2\x82"}, // not cut: kept as it is
	} {
		if got := textcut.Prefix(c.s, c.n); got != c.want {
			t.Errorf("Prefix(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
}

func TestEcho(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{
		{"short", 40, "short"},
		{"exactly5", 8, "exactly5"},
		{"abcdefgh", 4, "abcd…"},
		{"ééé", 5, "éé…"}, // 6 bytes; never inside a rune
		{"€€", 4, "€…"},
		{"a\xffb", 40, "a\uFFFDb"},           // invalid bytes replaced, even uncut
		{"\xff\xff\xff", 4, "\uFFFD"},        // a run of invalid bytes is one U+FFFD
		{"a\xffb\xffc\xffd", 6, "a\uFFFDb…"}, // replaced, then kept to 6 bytes
		{"ab\xffcd", 3, "ab…"},               // a replacement that would pass n is cut
	} {
		got := textcut.Echo(c.s, c.n)
		if got != c.want {
			t.Errorf("Echo(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
		if !utf8.ValidString(got) || len(strings.TrimSuffix(got, textcut.Mark)) > c.n {
			t.Errorf("Echo(%q, %d) = %q: want valid UTF-8 of at most %d bytes before the mark", c.s, c.n, got, c.n)
		}
	}
}

// Every cut of every string, valid or not, is a prefix within the bound
// that ends on a character's boundary, and an echo is valid UTF-8.
func FuzzCuts(f *testing.F) {
	f.Add("a€😀é\xff\xe2\x82b", 5)
	f.Fuzz(func(t *testing.T, s string, n int) {
		n %= len(s) + 2
		p := textcut.Prefix(s, n)
		if !strings.HasPrefix(s, p) || len(p) > max(n, 0) {
			t.Fatalf("Prefix(%q, %d) = %q: not a prefix within the bound", s, n, p)
		}
		if rest := s[len(p):]; rest != "" && !utf8.RuneStart(rest[0]) && len(p) < n {
			t.Fatalf("Prefix(%q, %d) = %q: shorter than the bound, yet the rest starts inside a character", s, n, p)
		}
		if e := textcut.Echo(s, n); !utf8.ValidString(e) || len(strings.TrimSuffix(e, textcut.Mark)) > max(n, 0) {
			t.Fatalf("Echo(%q, %d) = %q: invalid UTF-8 or over the bound", s, n, e)
		}
	})
}
