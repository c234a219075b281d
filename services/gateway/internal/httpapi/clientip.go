package httpapi

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// ParseTrustedProxies reads CIDRs (or single addresses) of the proxies whose
// X-Forwarded-For the gateway believes.
func ParseTrustedProxies(items []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, item := range items {
		if p, err := netip.ParsePrefix(item); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(item)
		if err != nil {
			return nil, fmt.Errorf("%q is neither a CIDR nor an IP address", item)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// clientIP returns the end client's address: the connection's peer, or, when
// the peer is a trusted proxy, the right-most X-Forwarded-For hop that is
// not itself a trusted proxy. Hops left of it were written by the client and
// prove nothing. A malformed hop ends the walk at the last trusted address.
func clientIP(r *http.Request, trusted []netip.Prefix) string {
	peer := remoteAddr(r)
	if !peer.IsValid() {
		return ""
	}
	if !isTrusted(peer, trusted) {
		return peer.String()
	}
	last := peer
	hops := forwardedHops(r.Header.Values("X-Forwarded-For"))
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseHop(hops[i])
		if !ok {
			break
		}
		if !isTrusted(a, trusted) {
			return a.String()
		}
		last = a
	}
	return last.String()
}

func remoteAddr(r *http.Request) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	return a.Unmap().WithZone("")
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// forwardedHops splits every X-Forwarded-For line into its hops, in order.
func forwardedHops(lines []string) []string {
	var hops []string
	for _, line := range lines {
		for hop := range strings.SplitSeq(line, ",") {
			hops = append(hops, strings.TrimSpace(hop))
		}
	}
	return hops
}

// parseHop reads one X-Forwarded-For entry: an IP, possibly with a port
// ("1.2.3.4:5", "[2001:db8::1]:5").
func parseHop(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	return netip.Addr{}, false
}
