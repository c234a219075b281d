package server

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"kurz.dev/pkg/linkdomain"
)

// opsHosts is the Host check of the listeners that serve the ops routes
// (the ops listener; the HTTP listener of a service without one), against
// DNS rebinding. A web page an operator opens while an ops port is
// forwarded to their machine (kubectl port-forward, the local stack) can
// point its own name at 127.0.0.1 and then read /metrics or /debug/pprof,
// or POST the limiter's /json, as its own origin: the browser sends that
// name as the Host. So these listeners answer only names a web page cannot
// point at them: IP literals (Prometheus and the kubelet's probes call pod
// IPs, the local scripts 127.0.0.1), localhost (what port-forward gives),
// Kubernetes Service names (no dot, or under .svc or .cluster.local, no
// public DNS name) and the names an operator lists
// (KURZ_OPS_ALLOWED_HOSTS). The public listeners (the redirect's and the
// gateway's HTTP, where custom domains arrive) are not checked.
type opsHosts struct {
	exact    map[string]bool
	suffixes []string // each with its leading dot
}

// newOpsHosts is the check that also takes the names of allowed: a name
// itself, or ".example.internal" for any name under it. The entries are
// checked by CheckAllowedHosts.
func newOpsHosts(allowed []string) opsHosts {
	h := opsHosts{exact: map[string]bool{}}
	for _, a := range allowed {
		if strings.HasPrefix(a, ".") {
			h.suffixes = append(h.suffixes, a)
		} else {
			h.exact[a] = true
		}
	}
	return h
}

// kubernetesSuffixes end the names Kubernetes DNS gives Services and pods
// (<service>.<namespace>.svc, then the cluster domain, cluster.local by
// default), and the names every browser resolves to the loopback itself
// (RFC 6761). None is delegated in public DNS, so no stranger can point
// one at a listener. A custom cluster domain goes in KURZ_OPS_ALLOWED_HOSTS
// (".svc.example.internal").
var kubernetesSuffixes = []string{".svc", ".cluster.local", ".localhost"}

// allow reports whether a request with this Host (host[:port]) is served.
func (h opsHosts) allow(hostport string) bool {
	if hostport == "" {
		// HTTP/1.0 without a Host: no browser sends one.
		return true
	}
	name := linkdomain.Host(hostport) // no port, no trailing dot, lower-case
	if name == "" {
		return false
	}
	if ip, ok := strings.CutPrefix(name, "["); ok {
		_, err := netip.ParseAddr(strings.TrimSuffix(ip, "]"))
		return err == nil
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return true
	}
	// A name without a dot is a Service of the caller's namespace (or a
	// search domain's); the browser's resolver never asks public DNS for
	// it as it is.
	return name == "localhost" || !strings.Contains(name, ".") || h.exact[name] ||
		underAny(name, kubernetesSuffixes) || underAny(name, h.suffixes)
}

// underAny reports whether name ends in one of suffixes.
func underAny(name string, suffixes []string) bool {
	for _, s := range suffixes {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// misdirected is the answer to a request whose Host the check refuses. It
// repeats nothing of the request.
const misdirected = "misdirected request: this listener answers only requests for an IP address, localhost, " +
	"a Kubernetes Service name (no dot, or ending in .svc or .cluster.local) or a name in KURZ_OPS_ALLOWED_HOSTS"

// guard answers 421 Misdirected Request to the requests whose Host h does
// not allow, before next sees them.
func (h opsHosts) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.allow(r.Host) {
			http.Error(w, misdirected, http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// CheckAllowedHosts refuses an entry of KURZ_OPS_ALLOWED_HOSTS that is not
// a lower-case host name without a port ("metrics.example.internal"), or
// one with a leading dot for every name under it (".example.internal").
func CheckAllowedHosts(variable string, hosts []string) error {
	for _, h := range hosts {
		name := strings.TrimPrefix(h, ".")
		if !hostName(name) {
			return fmt.Errorf("%s: %q is not a lower-case host name without a port (or a leading dot and one, for every name under it)", variable, h)
		}
	}
	return nil
}

// hostName reports whether name is labels of lower-case letters, digits,
// '-' and '_', of 1 to 63 bytes each, at most linkdomain.MaxLength in all.
func hostName(name string) bool {
	if name == "" || len(name) > linkdomain.MaxLength {
		return false
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > linkdomain.MaxLabel {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' && c != '_' {
				return false
			}
		}
	}
	return true
}
