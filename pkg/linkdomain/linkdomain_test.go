package linkdomain

import (
	"strings"
	"testing"
)

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"go.acme.com":           "go.acme.com",
		"GO.Acme.COM.":          "go.acme.com",
		"xn--bcher-kva.example": "xn--bcher-kva.example",
		"a-b.c0.io":             "a-b.c0.io",
		// Internationalised names, in the form DNS and Host headers carry.
		"bücher.example":  "xn--bcher-kva.example",
		"BÜCHER.Example.": "xn--bcher-kva.example",
		"例え.テスト":          "xn--r8jz45g.xn--zckzah",
		"go．acme．com":     "go.acme.com",
		"bücher．example．": "xn--bcher-kva.example",
	} {
		got, err := Normalize(in)
		if err != nil || got != want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{
		"", "localhost", "com", "192.0.2.1", "[::1]", "::1", "1.2.3.4.5", "a..b.com", ".a.com", "-a.com", "a-.com",
		"a_b.com", "a b.com", "a.com/x", "a.com:80", "a.123",
		strings.Repeat("a", 64) + ".com", strings.Repeat("abcdefghi.", 26) + "com",
		// Unicode that maps to a name refused in ASCII, or to no name.
		"ⓛⓞⓒⓐⓛⓗⓞⓢⓣ", "１２７.０.０.１", "bü cher.example", "ü_b.example", "\u00fc\u200e.example",
		strings.Repeat("ü", 64) + ".example", strings.Repeat("ü", 300) + ".example",
	} {
		if got, err := Normalize(bad); err == nil {
			t.Errorf("Normalize(%q) = %q, want an error", bad, got)
		}
	}
}

func TestKeySplit(t *testing.T) {
	for _, c := range []struct{ domain, code, key string }{
		{"", "1000ita", "1000ita"},
		{"go.acme.com", "1000ita", "go.acme.com/1000ita"},
	} {
		if k := Key(c.domain, c.code); k != c.key {
			t.Errorf("Key(%q, %q) = %q, want %q", c.domain, c.code, k, c.key)
		}
		if d, code := Split(c.key); d != c.domain || code != c.code {
			t.Errorf("Split(%q) = %q, %q", c.key, d, code)
		}
	}
}

func TestHost(t *testing.T) {
	for in, want := range map[string]string{
		"go.acme.com":            "go.acme.com",
		"GO.acme.com:8787":       "go.acme.com",
		"go.acme.com.":           "go.acme.com",
		"127.0.0.1:8787":         "127.0.0.1",
		"[::1]:8787":             "[::1]",
		"[::1]":                  "[::1]",
		"":                       "",
		strings.Repeat("a", 300): "",
	} {
		if got := Host(in); got != want {
			t.Errorf("Host(%q) = %q, want %q", in, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = Host("go.acme.com:8787") }); n != 0 {
		t.Errorf("Host of a lower-case host allocates %.0f times, want 0", n)
	}
}
