// Package urlcheck decides whether a long URL may be shortened, and in which
// normal form it is stored. It refuses what makes a shortener a free
// XSS/phishing tool: non-http(s) schemes, user-info tricks, private network
// targets, redirect loops through kurz itself, and destinations on the
// blocklist (or any other Scanner).
package urlcheck

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"kurz.dev/pkg/urlnorm"
)

// Reasons are the machine-readable causes of a refusal; the shortener sends
// them as google.rpc.ErrorInfo.reason with domain "kurz.dev".
const (
	ReasonRequired     = "URL_REQUIRED"
	ReasonTooLong      = "URL_TOO_LONG"
	ReasonMalformed    = "URL_MALFORMED"
	ReasonScheme       = "URL_SCHEME_NOT_ALLOWED"
	ReasonHostRequired = "URL_HOST_REQUIRED"
	ReasonHostInvalid  = "URL_HOST_INVALID"
	ReasonUserInfo     = "URL_USERINFO_NOT_ALLOWED"
	ReasonPrivateHost  = "URL_HOST_PRIVATE"
	ReasonLoop         = "URL_REDIRECT_LOOP"
	ReasonBlocked      = "URL_BLOCKED"
)

// Error is a refusal: a stable Reason and a message a person can act on. It
// never echoes the URL back.
type Error struct {
	Reason  string
	Message string
}

func (e *Error) Error() string { return e.Message }

func refuse(reason, format string, args ...any) *Error {
	return &Error{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// Policy is the syntactic part of the check: it needs no I/O.
type Policy struct {
	// MaxLength bounds the URL, before and after normalisation.
	MaxLength int
	// AllowPrivateHosts lets literal loopback, private, link-local and other
	// non-public IPs (and localhost names) through; for development only.
	AllowPrivateHosts bool
	// OwnHosts are the short domains kurz answers on (any port); links to
	// them would loop.
	OwnHosts []string
}

// Normalize checks raw and returns its normal form: lowercase scheme, host in
// lowercase punycode (or a canonical IP), default port dropped, the rest
// re-encoded as net/url writes it, with spaces, quotes, angle brackets and
// every non-ASCII byte in the query percent-encoded (urlnorm.EscapeQuery),
// so that the stored form is what the redirect sends. Normalize is
// idempotent.
func (p Policy) Normalize(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	switch {
	case raw == "":
		return "", refuse(ReasonRequired, "long_url is required")
	case len(raw) > p.MaxLength:
		return "", refuse(ReasonTooLong, "the URL is longer than %d characters", p.MaxLength)
	case !utf8.ValidString(raw):
		return "", refuse(ReasonMalformed, "the URL is not valid UTF-8")
	case strings.ContainsRune(raw, '\\'):
		// Browsers read '\' as '/' in http(s) URLs; net/url does not. Refuse
		// rather than store a URL whose host the two disagree on.
		return "", refuse(ReasonMalformed, "the URL contains a backslash; percent-encode it as %%5C")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", refuse(ReasonMalformed, "the URL cannot be parsed; check its syntax")
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "http" && scheme != "https" {
		return "", refuse(ReasonScheme, "only http and https URLs can be shortened (include the scheme, e.g. https://)")
	}
	if u.User != nil {
		return "", refuse(ReasonUserInfo, "URLs with user info (user@ or user:password@ before the host) are refused")
	}
	if u.Opaque != "" || u.Host == "" || u.Hostname() == "" {
		return "", refuse(ReasonHostRequired, "the URL needs a host, as in https://example.com/path")
	}
	host, err := p.host(u.Hostname())
	if err != nil {
		return "", err
	}
	port, err := Port(scheme, u.Port())
	if err != nil {
		return "", refuse(ReasonMalformed, "the URL's port must be a number from 1 to 65535")
	}
	for _, own := range p.OwnHosts {
		if host == own {
			return "", refuse(ReasonLoop, "links to this short domain are refused: they would redirect in a loop")
		}
	}
	u.Scheme = scheme
	u.Host = host
	u.RawQuery = urlnorm.EscapeQuery(u.RawQuery)
	if strings.Contains(host, ":") {
		u.Host = "[" + host + "]"
	}
	if port != "" {
		u.Host += ":" + port
	}
	out := u.String()
	if len(out) > p.MaxLength {
		return "", refuse(ReasonTooLong, "the URL is longer than %d characters once normalised", p.MaxLength)
	}
	return out, nil
}

// Port is the port of a URL of scheme (lower case) as a client dials it:
// without leading zeros, and "" for none or the scheme's own (80, 443);
// an error for one that is not a number from 1 to 65535.
func Port(scheme, port string) (string, error) {
	if port == "" {
		return "", nil
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	if (scheme == "http" && n == 80) || (scheme == "https" && n == 443) {
		return "", nil
	}
	return strconv.Itoa(n), nil
}

// host normalises a host name or IP literal and applies the private-network
// rule.
func (p Policy) host(h string) (string, error) {
	if strings.Contains(h, ":") { // IPv6 literal (url.Parse keeps brackets off Hostname)
		a, err := netip.ParseAddr(h)
		if err != nil || a.Zone() != "" || !a.Is6() {
			return "", refuse(ReasonHostInvalid, "the URL's IPv6 address is not valid")
		}
		return p.ip(a)
	}
	ascii, err := urlnorm.Host(h)
	if err != nil || ascii == "" {
		return "", refuse(ReasonHostInvalid, "the URL's host is not a valid domain name")
	}
	if endsInNumber(ascii) {
		// Browsers read hosts such as 127.1, 0x7f.0.0.1 or 2130706433 as IPv4.
		a, ok := parseIPv4(ascii)
		if !ok {
			return "", refuse(ReasonHostInvalid, "the URL's host is neither a domain name nor a valid IPv4 address")
		}
		return p.ip(a)
	}
	labels := strings.Split(ascii, ".")
	for _, l := range labels {
		if l == "" || l[0] == '-' || l[len(l)-1] == '-' {
			return "", refuse(ReasonHostInvalid, "the URL's host is not a valid domain name")
		}
	}
	if p.AllowPrivateHosts {
		return ascii, nil // development: localhost and intranet names too
	}
	if localName(ascii) {
		return "", refuse(ReasonPrivateHost, "links to local network names such as localhost are refused")
	}
	if len(labels) < 2 {
		return "", refuse(ReasonHostInvalid, "the URL's host must be a fully qualified domain name, such as example.com")
	}
	return ascii, nil
}

func (p Policy) ip(a netip.Addr) (string, error) {
	a = a.Unmap()
	if !p.AllowPrivateHosts && !publicIP(a) {
		return "", refuse(ReasonPrivateHost, "links to loopback, private, link-local or otherwise non-public IP addresses are refused")
	}
	return a.String(), nil
}

var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"), // carrier-grade NAT
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"), // benchmarking
	netip.MustParsePrefix("240.0.0.0/4"),   // reserved, broadcast
	netip.MustParsePrefix("::/96"),         // IPv4-compatible (deprecated)
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("100::/64"), // discard
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("2001::/32"),       // Teredo: a tunnel to an address it hides
	netip.MustParsePrefix("fec0::/10"),       // site-local (deprecated)
	netip.MustParsePrefix("::ffff:0:0:0/96"), // IPv4-translated (SIIT)
	netip.MustParsePrefix("192.88.99.0/24"),  // 6to4 relays (deprecated)
}

// nat64 and sixToFour embed an IPv4 address, which is judged instead:
// 64:ff9b::a.b.c.d and 2002:aabb:ccdd::/48.
var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// embeddedIPv4 returns the IPv4 address a NAT64 or 6to4 address a reaches:
// the one it stands for.
func embeddedIPv4(a netip.Addr) (netip.Addr, bool) {
	b := a.As16()
	switch {
	case nat64.Contains(a):
		return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), true
	case sixToFour.Contains(a):
		return netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), true
	}
	return netip.Addr{}, false
}

func publicIP(a netip.Addr) bool {
	if a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() {
		return false
	}
	if v4, ok := embeddedIPv4(a); ok { // judge the IPv4 address it embeds
		return publicIP(v4)
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

func localName(h string) bool {
	for _, suffix := range []string{"localhost", "local", "internal", "home.arpa", "lan", "localdomain"} {
		if h == suffix || strings.HasSuffix(h, "."+suffix) {
			return true
		}
	}
	return false
}

// endsInNumber is the WHATWG URL "ends in a number" checker.
func endsInNumber(h string) bool {
	labels := strings.Split(h, ".")
	last := labels[len(labels)-1]
	if last == "" {
		return false
	}
	if strings.Trim(last, "0123456789") == "" {
		return true
	}
	_, ok := ipv4Part(last)
	return ok
}

// parseIPv4 is the WHATWG IPv4 parser: 1 to 4 parts, each decimal, octal
// (leading 0) or hex (0x); the last part fills the remaining bytes.
func parseIPv4(h string) (netip.Addr, bool) {
	parts := strings.Split(h, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var n uint64
	for i, part := range parts {
		v, ok := ipv4Part(part)
		if !ok {
			return netip.Addr{}, false
		}
		if i < len(parts)-1 {
			if v > 255 {
				return netip.Addr{}, false
			}
			n = n<<8 | v
			continue
		}
		rest := uint(5 - len(parts))
		if v >= 1<<(8*rest) {
			return netip.Addr{}, false
		}
		n = n<<(8*rest) | v
	}
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}

func ipv4Part(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	base := 10
	switch {
	case len(s) >= 2 && (s[:2] == "0x" || s[:2] == "0X"):
		s, base = s[2:], 16
		if s == "" {
			return 0, true
		}
	case len(s) >= 2 && s[0] == '0':
		s, base = s[1:], 8
	}
	v, err := strconv.ParseUint(s, base, 64)
	if err != nil || v > 1<<32 {
		return 0, false
	}
	return v, true
}

// OwnHost returns the normalised host of a base URL (KURZ_SHORTENER_BASE_URL)
// or of a bare host name, for Policy.OwnHosts.
func OwnHost(s string) (string, error) {
	h := s
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil {
			return "", err
		}
		h = u.Hostname()
	} else if host, _, err := net.SplitHostPort(s); err == nil {
		h = host
	}
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Unmap().String(), nil
	}
	if a, ok := parseIPv4(h); ok && endsInNumber(h) {
		return a.String(), nil
	}
	return urlnorm.Host(h)
}

// PublicIP reports whether a is a public unicast address: not loopback,
// private, link-local, multicast, unspecified, carrier-grade NAT or
// otherwise reserved (an IPv4-mapped address is judged by its IPv4 form).
// The webhook sender checks every address it dials with it.
func PublicIP(a netip.Addr) bool { return publicIP(a.Unmap()) }

// LocalName reports whether host is a name that only resolves locally
// (localhost, *.local, *.internal, ...).
func LocalName(host string) bool { return localName(strings.ToLower(strings.TrimSuffix(host, "."))) }

// ParseHostIPv4 reads a URL's host as browsers do (the WHATWG URL
// standard), for callers that check hosts without Normalize: a host whose
// last label is a number (127.1, 0x7f.1, 2130706433, 017700000001, 0) is
// an IPv4 address of up to four decimal, octal or hex parts, not a name.
// numeric reports whether host ends in a number; ok, whether it then
// parses (browsers refuse such a host when it does not, e.g. 1.2.3.4.5).
func ParseHostIPv4(host string) (a netip.Addr, numeric, ok bool) {
	h, err := urlnorm.Host(host)
	if err != nil {
		h = strings.ToLower(strings.TrimSuffix(host, "."))
	}
	if !endsInNumber(h) {
		return netip.Addr{}, false, false
	}
	a, ok = parseIPv4(h)
	return a, true, ok
}
