package redirector

import (
	"net/http"
	"strings"
)

// pointsBack reports whether target, the URL a redirect is about to send,
// names the host and port its request came in on (hostport, the request's
// Host header): following it asks the redirect for the same link again,
// for ever, each round spending a visit and recording a click. The
// shortener refuses targets on the hosts it knows are kurz's, but not a
// name it was never told of (another DNS name of the redirect, or
// KURZ_REDIRECT_DEFAULT_HOSTS left empty, which serves every host); this
// catches every such loop of one hop, whatever name the link used.
//
// Hosts compare without case and without a trailing dot. A missing port,
// 80 and 443 count as one port: the redirect does not reliably know the
// scheme it was reached by behind a proxy, and a name that serves kurz on
// one web port serves it on the other (or upgrades http to https there).
// Only http and https targets can come back. It parses no URL and
// allocates nothing: every redirect runs it.
func pointsBack(hostport, target string) bool {
	scheme, rest, ok := strings.Cut(target, "://")
	if !ok || !(strings.EqualFold(scheme, "http") || strings.EqualFold(scheme, "https")) {
		return false
	}
	// Browsers end an http(s) authority at a backslash too.
	if i := strings.IndexAny(rest, "/?#\\"); i >= 0 {
		rest = rest[:i]
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		rest = rest[i+1:]
	}
	host, port := splitHostPort(rest)
	reqHost, reqPort := splitHostPort(hostport)
	if host == "" || !strings.EqualFold(host, reqHost) {
		return false
	}
	p, q := webPort(port), webPort(reqPort)
	return p >= 0 && p == q
}

// splitHostPort splits an authority (no user info) into its host, without
// the brackets of an IPv6 literal or a trailing dot, and its port ("" when
// there is none).
func splitHostPort(a string) (host, port string) {
	if strings.HasPrefix(a, "[") {
		end := strings.IndexByte(a, ']')
		if end < 0 {
			return "", ""
		}
		host, port = a[1:end], a[end+1:]
		if port != "" && port[0] != ':' {
			return "", ""
		}
		return host, strings.TrimPrefix(port, ":")
	}
	if i := strings.LastIndexByte(a, ':'); i >= 0 {
		host, port = a[:i], a[i+1:]
	} else {
		host = a
	}
	return strings.TrimSuffix(host, "."), port
}

// webPort is the number of port, with 0 for the default web ports ("",
// 80, 443) and -1 for what is no port number.
func webPort(port string) int {
	if port == "" {
		return 0
	}
	n := 0
	for i := 0; i < len(port); i++ {
		c := port[i]
		if c < '0' || c > '9' || n > 65535 {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	switch {
	case n > 65535:
		return -1
	case n == 80 || n == 443:
		return 0
	}
	return n
}

// loopPage answers a redirect that would point back at itself: 508 Loop
// Detected, no Location. The visit is not spent and no click is recorded.
func loopPage(w http.ResponseWriter) int {
	page(w, http.StatusLoopDetected)
	return http.StatusLoopDetected
}
