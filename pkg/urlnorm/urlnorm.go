// Package urlnorm holds the parts of a long URL's normal form that more
// than the shortener need: the host in lowercase punycode and the query's
// escapes. The shortener stores URLs in that form (urlcheck.Normalize); an
// import compares a file's URLs with stored ones through it.
package urlnorm

import (
	"errors"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

var hostProfile = idna.New(
	idna.MapForLookup(), // lowercase, full-width to ASCII, UTS #46 mapping
	idna.BidiRule(),
	idna.Transitional(false),
	// Real hosts such as r4---sn-abc.googlevideo.com break the RFC 5891
	// hyphen rule; browsers (WHATWG) do not apply it either.
	idna.CheckHyphens(false),
	idna.VerifyDNSLength(true),
)

// Host returns the ASCII (punycode) lowercase form of a host name
// without a trailing dot, or an error for a host no browser could reach.
func Host(h string) (string, error) {
	if !utf8.ValidString(h) {
		return "", errors.New("host is not valid UTF-8")
	}
	ascii, err := hostProfile.ToASCII(strings.TrimSuffix(h, "."))
	if err != nil {
		return "", err
	}
	// A label that maps to a replacement character or an invalid punycode
	// label can come out as ASCII that no longer validates: refuse it.
	if again, err := hostProfile.ToASCII(ascii); err != nil || again != ascii {
		return "", errors.New("host does not survive normalisation")
	}
	return ascii, nil
}

// EscapeQuery percent-encodes what net/url leaves raw in a query but a
// client could read differently: space, '"', '<' and '>' (as browsers do)
// and non-ASCII white space, control and format characters (U+00A0, U+0085,
// U+2028, U+202E, ...), which can end a URL where it is printed or reorder
// it on screen. Other non-ASCII characters stay as written (ASCII controls
// never get here: url.Parse refuses them). Escapes already there are kept,
// so the result is stable.
func EscapeQuery(q string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(q); {
		r, size := utf8.DecodeRuneInString(q[i:])
		raw := q[i : i+size]
		i += size
		if r != ' ' && r != '"' && r != '<' && r != '>' &&
			(r < utf8.RuneSelf || !unicode.IsSpace(r) && !unicode.IsControl(r) && !unicode.Is(unicode.Cf, r)) {
			b.WriteString(raw)
			continue
		}
		for j := 0; j < len(raw); j++ {
			b.WriteByte('%')
			b.WriteByte(hexDigits[raw[j]>>4])
			b.WriteByte(hexDigits[raw[j]&15])
		}
	}
	return b.String()
}
