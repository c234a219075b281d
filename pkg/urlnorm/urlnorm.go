// Package urlnorm holds the parts of a long URL's normal form that more
// than the shortener need: the host in lowercase punycode and the query's
// escapes. The shortener stores URLs in that form (urlcheck.Normalize); an
// import compares a file's URLs with stored ones through it.
package urlnorm

import (
	"errors"
	"strings"
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
// and every byte over 0x7F. The stored form is then what a redirect sends
// (a Location header must be a URI, and the redirect escapes non-ASCII
// bytes in it): written as ä or as %C3%A4, a query is one destination.
// Non-ASCII white space, control and format characters (U+00A0, U+2028,
// U+202E, ...), which can end a URL where it is printed or reorder it on
// screen, are escaped with the rest. ASCII controls never get here
// (url.Parse refuses them). Everything else stays as written, in its order,
// and escapes already there are kept, so the result is stable.
func EscapeQuery(q string) string {
	const hexDigits = "0123456789ABCDEF"
	i := 0
	for i < len(q) && !escapeInQuery(q[i]) {
		i++
	}
	if i == len(q) {
		return q // nearly every query
	}
	b := make([]byte, 0, len(q)+16)
	b = append(b, q[:i]...)
	for ; i < len(q); i++ {
		if c := q[i]; escapeInQuery(c) {
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}

func escapeInQuery(c byte) bool {
	return c >= utf8.RuneSelf || c == ' ' || c == '"' || c == '<' || c == '>'
}
