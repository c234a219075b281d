// Package clientip is kurz's one policy for who the client of an HTTP
// request is, and for the key a client's limits and counters are kept under.
// The public services (gateway, redirect) ask it who the client is;
// nothing else reads X-Forwarded-For or the peer address for that purpose.
// Keying is the one key of an address, wherever one is counted: the
// connection cap of pkg/server, the shortener's per-address rules, the
// limiter's Envoy remote_address and its forward auth, which reads the
// client's address from the proxy it names (ParseHop) and nothing else.
//
// The client is the connection's peer, unless the peer is a trusted proxy.
// From a trusted peer, X-Forwarded-For is walked from the right, skipping
// only trusted hops: the first untrusted address is the client (hops left of
// it were written by the client and prove nothing). Alternatively a proxy's
// single-value header (X-Real-IP, CF-Connecting-IP) is read instead, again
// only from trusted peers. Headers from any other peer are ignored.
//
// Keys: an IPv4 client is its address; an IPv6 client is its prefix (/64 by
// default), since one subscriber holds a whole /64 and could otherwise rotate
// through 2^64 identities; an IPv4-mapped IPv6 address is its IPv4 twin.
package clientip

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// MaxHops bounds how many X-Forwarded-For entries one request may make the
// walk parse. A real chain of proxies is a handful long; past the bound the
// walk stops as at a malformed hop.
const MaxHops = 16

// forwardedFor is the chain header every proxy appends to.
const forwardedFor = "X-Forwarded-For"

// DefaultIPv6Prefix is the IPv6 prefix of one client: a subscriber's usual
// allocation.
const DefaultIPv6Prefix = 64

// MinIPv6Prefix is the shortest IPv6 prefix a Keying takes: shorter would
// put whole sites' (or an ISP's) unrelated users under one key.
const MinIPv6Prefix = 48

// Keying turns client addresses into limiter keys. Embed it in a service's
// Config: every service that keys by client IP must use the same prefix, or
// one client's limits would be split or merged differently at each service.
type Keying struct {
	// IPv6Prefix is how many leading bits of an IPv6 address name one
	// client (48..128); 0, the zero Keying's, is DefaultIPv6Prefix, never
	// "every IPv6 client is one".
	IPv6Prefix int `env:"CLIENT_IPV6_PREFIX" default:"64"`
}

// Check reports a prefix length outside MinIPv6Prefix..128: shorter would
// put whole sites' unrelated users under one key. It checks a Config's
// Keying, whose 0 is no default (the variable's default is 64).
func (k Keying) Check() error {
	if k.IPv6Prefix < MinIPv6Prefix || k.IPv6Prefix > 128 {
		return fmt.Errorf("KURZ_CLIENT_IPV6_PREFIX=%d: want %d..128", k.IPv6Prefix, MinIPv6Prefix)
	}
	return nil
}

// Key is the limiter key of a: IPv4 (and IPv4-mapped IPv6) addresses as
// themselves ("203.0.113.5"), IPv6 addresses as their prefix
// ("2001:db8:1:2::/64"); "" for an invalid address.
func (k Keying) Key(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	a = a.Unmap().WithZone("")
	bits := k.IPv6Prefix
	if bits == 0 {
		bits = DefaultIPv6Prefix
	}
	if a.Is4() || bits >= 128 {
		return a.String()
	}
	p, err := a.Prefix(bits)
	if err != nil { // a prefix Check refused; keep the address whole
		return a.String()
	}
	return p.String()
}

// KeyString is Key of an address in text (as gRPC metadata carries it); ""
// when s is not an address.
func (k Keying) KeyString(s string) string {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return ""
	}
	return k.Key(a)
}

// Policy finds the client of a request. The zero Policy, and a nil one,
// trust no proxy: every client is its peer.
type Policy struct {
	trusted []netip.Prefix
	header  string // canonical; "" walks X-Forwarded-For
}

// New returns the policy that believes proxies in trusted (CIDRs or single
// addresses). header, when not empty, names a single-value header those
// proxies set to the client address, read instead of X-Forwarded-For
// ("X-Forwarded-For" itself means the default walk). A header without
// trusted proxies is an error: it would be believed from no one, and
// silently ignoring it would hide a misconfiguration.
func New(trusted []string, header string) (*Policy, error) {
	var errs []error
	p := &Policy{}
	for _, item := range trusted {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if pfx, err := netip.ParsePrefix(item); err == nil {
			p.trusted = append(p.trusted, unmapPrefix(pfx))
			continue
		}
		a, err := netip.ParseAddr(item)
		if err != nil {
			errs = append(errs, fmt.Errorf("%q is neither a CIDR nor an IP address", item))
			continue
		}
		a = a.Unmap().WithZone("")
		p.trusted = append(p.trusted, netip.PrefixFrom(a, a.BitLen()))
	}
	header = http.CanonicalHeaderKey(strings.TrimSpace(header))
	if header != "" && header != forwardedFor {
		p.header = header
	}
	if header != "" && len(p.trusted) == 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("header %s is believed only from trusted proxies, and none is set", header))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}

// unmapPrefix turns an IPv4-mapped prefix (::ffff:10.0.0.0/104) into its
// IPv4 form, since addresses are compared unmapped.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	p = p.Masked()
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

// Trusted reports whether a is one of the trusted proxies.
func (p *Policy) Trusted(a netip.Addr) bool {
	if p == nil {
		return false
	}
	for _, t := range p.trusted {
		if t.Contains(a) {
			return true
		}
	}
	return false
}

// FromTrustedProxy reports whether r's peer is a trusted proxy, whose
// forwarding headers (X-Forwarded-Proto too) may be believed.
func (p *Policy) FromTrustedProxy(r *http.Request) bool {
	peer := Peer(r)
	return peer.IsValid() && p.Trusted(peer)
}

// Client returns the address of r's client (unmapped, without zone); the
// zero Addr when even the peer address cannot be read.
func (p *Policy) Client(r *http.Request) netip.Addr {
	peer := Peer(r)
	if !peer.IsValid() || !p.Trusted(peer) {
		return peer
	}
	if p.header != "" {
		// One value, one address; anything else is the proxy's mistake
		// and names no one: the proxy itself is the client then.
		if v := r.Header.Values(p.header); len(v) == 1 {
			if a, ok := ParseHop(v[0]); ok {
				return a
			}
		}
		return peer
	}
	return p.walk(peer, r.Header.Values(forwardedFor))
}

// walk reads X-Forwarded-For lines from the right: the first hop that is not
// trusted is the client. A malformed hop, or more than MaxHops, ends the walk
// at the last trusted address seen, as does running out of hops.
func (p *Policy) walk(peer netip.Addr, lines []string) netip.Addr {
	last := peer
	hops := 0
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for {
			hop := line
			cut := strings.LastIndexByte(line, ',')
			if cut >= 0 {
				hop, line = line[cut+1:], line[:cut]
			}
			if hops++; hops > MaxHops {
				return last
			}
			a, ok := ParseHop(hop)
			if !ok {
				return last
			}
			if !p.Trusted(a) {
				return a
			}
			last = a
			if cut < 0 {
				break
			}
		}
	}
	return last
}

// Peer is the address of r's connection peer; the zero Addr if RemoteAddr
// holds none (a handler called outside net/http).
func Peer(r *http.Request) netip.Addr {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		return ap.Addr().Unmap().WithZone("")
	}
	a, _ := ParseHop(r.RemoteAddr)
	return a
}

// maxHopLen bounds one hop's text: the longest address with brackets and a
// port ("[ffff:…:255.255.255.255%zone]:65535") stays well below it.
const maxHopLen = 64

// ParseHop reads one forwarding entry: an IPv4 or IPv6 address, possibly
// with a port ("1.2.3.4:5", "[2001:db8::1]:5") or in brackets
// ("[2001:db8::1]"), surrounded by optional spaces. The address comes back
// unmapped and without zone.
func ParseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > maxHopLen {
		return netip.Addr{}, false
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	if inner, ok := strings.CutPrefix(s, "["); ok {
		if inner, ok = strings.CutSuffix(inner, "]"); ok {
			if a, err := netip.ParseAddr(inner); err == nil && a.Is6() {
				return a.Unmap().WithZone(""), true
			}
		}
	}
	return netip.Addr{}, false
}

// uniqueLocal is IPv6's private range (fc00::/7).
var uniqueLocal = netip.MustParsePrefix("fc00::/7")

// Warning is a sentence for a startup WARN when a trusted range is wider
// than the widest private one (10.0.0.0/8, fc00::/7), or is a public IPv6
// range wider than /16 (a regional registry's share: 2a00::/12 holds much
// of Europe; a CDN's published ranges are /29 or narrower): every client
// in it may name its own address in X-Forwarded-For, and so pick the
// address every per-client bound counts. It may be meant (only proxies can
// reach the service), so it is not refused. "" when no range is that wide.
func (p *Policy) Warning() string {
	if p == nil {
		return ""
	}
	var wide []string
	for _, t := range p.trusted {
		if t.Addr().Is4() && t.Bits() < 8 || t.Addr().Is6() && (t.Bits() < 7 || t.Bits() < 16 && !uniqueLocal.Contains(t.Addr())) {
			wide = append(wide, t.String())
		}
	}
	if len(wide) == 0 {
		return ""
	}
	return "trusted proxies " + strings.Join(wide, ",") + " hold much of the internet: any client there names its own address (list only the proxies in front of the service)"
}

// String describes the policy for a startup log line.
func (p *Policy) String() string {
	if p == nil {
		return "trusted=[]"
	}
	parts := make([]string, len(p.trusted))
	for i, t := range p.trusted {
		parts[i] = t.String()
	}
	s := "trusted=[" + strings.Join(parts, ",") + "]"
	if p.header != "" {
		s += " header=" + strconv.Quote(p.header)
	}
	return s
}
