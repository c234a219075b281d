package config

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// HostPort refuses addr unless it is host:port with a host name or IP and a
// port from 1 to 65535, as every address a service dials must be: clients
// fill a missing port in differently (gRPC's DNS resolver dials 443,
// go-redis fails each dial), so a forgotten port showed only later, as an
// outage. A URL with credentials (redis://:password@host:6379) is refused
// too, and its error does not repeat them (Redacted): dialled, it put the
// password in every dial error logged. The caller names the variable.
func HostPort(addr string) error {
	const want = "want host:port (no URL, no credentials: passwords have variables of their own)"
	host, port, err := net.SplitHostPort(addr)
	if err != nil || !validHost(host) {
		return fmt.Errorf("%q: %s", Redacted(addr), want)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: %s, the port from 1 to 65535", Redacted(addr), want)
	}
	return nil
}

// validHost reports whether host is an IP address or a DNS name's letters,
// digits, dots, hyphens and underscores.
func validHost(host string) bool {
	if host == "" {
		return false
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	for _, c := range host {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Redacted is addr for an error message or a log line, the credentials of
// a URL-like address replaced by xxxxx: everything before its last @ but
// the scheme, and its query or fragment (a DSN's ?password=, a token
// parameter).
func Redacted(addr string) string {
	head, rest := "", addr
	if at := strings.LastIndex(addr, "@"); at >= 0 {
		if i := strings.Index(addr[:at], "://"); i >= 0 {
			head = addr[:i+3]
		}
		head, rest = head+"xxxxx@", addr[at+1:]
	}
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest = rest[:i+1] + "xxxxx"
	}
	return head + rest
}
