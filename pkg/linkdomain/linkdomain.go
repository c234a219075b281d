// Package linkdomain holds what every kurz component knows about custom
// domains (issue #20): which names a tenant may register, how a request's
// Host header becomes a domain, and the link key.
//
// A link on the default domain is keyed by its code alone, as before custom
// domains existed; a link on a custom domain by "<domain>/<code>". The key is
// what PostgreSQL's links.code holds, what the Redis cache and visit counter
// keys, the redirect's L1 and the click events' code field carry and what
// ClickHouse's rows are keyed by: default-domain keys stay byte-identical,
// and no store's schema needs a domain column to keep codes unique per
// domain. APIs carry the domain as a field of its own and the bare code.
package linkdomain

import (
	"fmt"
	"net/netip"
	"strings"
	"unicode/utf8"

	"kurz.dev/pkg/urlnorm"
)

// MaxLength bounds a domain name (RFC 1035's 253 characters of a name in
// text form); MaxLabel bounds one label.
const (
	MaxLength = 253
	MaxLabel  = 63
)

// MaxInput bounds a domain name as a caller writes it, in bytes: an
// internationalised name of MaxLength characters (and a trailing dot) in
// UTF-8, which Normalize writes in its punycode form.
const MaxInput = utf8.UTFMax * (MaxLength + 1)

// ChangedChannel is the Redis Pub/Sub channel on which the shortener
// publishes a domain's name after it was verified, or deleted while
// verified (what the redirect serves changed, and only then): redirect pods
// re-read the verified set at once rather than at their next refresh.
// Delivery is best effort; the refresh interval bounds a lost message.
const ChangedChannel = "domains:changed"

// ChallengePrefix is the label before a domain of the TXT record that proves
// its ownership: "_kurz-challenge.go.acme.com".
const ChallengePrefix = "_kurz-challenge."

// MaxRegistered bounds a domain a tenant registers: its challenge record
// (ChallengePrefix + name) must itself be a name of at most MaxLength
// characters, or the domain could never be verified by DNS.
const MaxRegistered = MaxLength - len(ChallengePrefix)

// Problem says what is wrong with name as a custom domain ("" if nothing):
// it must be a lower-case host name (letters, digits and '-' in labels of 1
// to 63 characters that neither start nor end with '-', at least two labels,
// a last label that is not all digits), at most MaxLength characters, and
// not an IP address. Callers lower-case first (Normalize).
func Problem(name string) string {
	switch {
	case name == "":
		return "a domain name is required, e.g. go.example.com"
	case len(name) > MaxLength:
		return fmt.Sprintf("a domain name has at most %d characters", MaxLength)
	}
	if _, err := netip.ParseAddr(strings.Trim(name, "[]")); err == nil {
		return "an IP address is not a domain name"
	}
	labels := strings.Split(name, ".")
	if len(labels) < 2 {
		return "a domain name has at least two labels, e.g. go.example.com"
	}
	for _, l := range labels {
		if l == "" || len(l) > MaxLabel {
			return fmt.Sprintf("every label of a domain name has 1 to %d characters", MaxLabel)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "a label of a domain name neither starts nor ends with '-'"
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return "a domain name has only letters, digits, '-' and '.'"
			}
		}
	}
	if last := labels[len(labels)-1]; strings.Trim(last, "0123456789") == "" {
		return "the last label of a domain name is not all digits"
	}
	return ""
}

// Normalize lower-cases name, writes an internationalised one in its
// punycode (xn--) form, as DNS and a browser's Host header carry it, and
// drops one trailing dot (the DNS root), then checks it (Problem); it
// returns the name or the problem as an error.
func Normalize(name string) (string, error) {
	if len(name) > MaxInput {
		return "", fmt.Errorf("a domain name has at most %d characters", MaxLength)
	}
	n := strings.TrimSuffix(strings.ToLower(name), ".")
	if strings.ContainsFunc(n, func(r rune) bool { return r >= utf8.RuneSelf }) {
		// A name IDNA refuses keeps its characters: Problem names them.
		if a, err := urlnorm.Host(n); err == nil {
			n = strings.TrimSuffix(a, ".") // a full stop IDNA mapped to "."
		}
	}
	if p := Problem(n); p != "" {
		return "", fmt.Errorf("%s", p)
	}
	return n, nil
}

// Key is the link key of code on domain: code itself on the default domain
// (""), "<domain>/<code>" on a custom one.
func Key(domain, code string) string {
	if domain == "" {
		return code
	}
	return domain + "/" + code
}

// Split reverses Key: the domain ("" for the default) and the code of key.
func Split(key string) (domain, code string) {
	if i := strings.LastIndexByte(key, '/'); i >= 0 {
		return key[:i], key[i+1:]
	}
	return "", key
}

// Host is the domain a request's Host header names: the port removed (also
// from a bracketed IPv6 literal), one trailing dot dropped, lower-cased.
// It does not allocate when the host is already lower-case. A host longer
// than MaxLength (plus a port) gives "", which matches no domain.
func Host(hostport string) string {
	if len(hostport) > MaxLength+7 {
		return ""
	}
	h := hostport
	if i := strings.LastIndexByte(h, ':'); i >= 0 && strings.IndexByte(h[i:], ']') < 0 {
		h = h[:i]
	}
	h = strings.TrimSuffix(h, ".")
	for i := 0; i < len(h); i++ {
		if c := h[i]; c >= 'A' && c <= 'Z' {
			return strings.ToLower(h)
		}
	}
	return h
}
