package redirector

import (
	"sync/atomic"

	"kurz.dev/pkg/linkdomain"
)

// Hosts says which Host headers the redirect serves: its default hosts
// (the default domain, links keyed by their code) and the verified custom
// domains (links keyed "<domain>/<code>", each domain held by one tenant).
// The domain set is replaced as a whole (SetDomains) by a loader that reads
// it every few seconds, so a request never waits on a store to learn its
// host: an unknown host costs a map lookup. Until the first SetDomains no
// host but a default one is served: without the set, a custom domain's
// host cannot be told from a stray one, and would otherwise serve the
// default domain's links (with no default hosts configured).
type Hosts struct {
	// defaults are the default domain's hosts; empty: every host that is
	// not a custom domain.
	defaults map[string]struct{}
	// domains is nil until the first SetDomains.
	domains atomic.Pointer[map[string]string]
}

// NewHosts returns Hosts serving defaults (host names, any case, no port)
// as the default domain; none: every host that is not a custom domain.
func NewHosts(defaults []string) *Hosts {
	h := &Hosts{}
	if len(defaults) > 0 {
		h.defaults = make(map[string]struct{}, len(defaults))
		for _, d := range defaults {
			h.defaults[linkdomain.Host(d)] = struct{}{}
		}
	}
	return h
}

// SetDomains replaces the custom domains: verified domain name -> the
// tenant that holds it. The map must not change afterwards.
func (h *Hosts) SetDomains(domains map[string]string) {
	h.domains.Store(&domains)
}

// Domains returns how many custom domains are served.
func (h *Hosts) Domains() int {
	if m := h.domains.Load(); m != nil {
		return len(*m)
	}
	return 0
}

// Loaded reports whether the custom domains were set at least once.
func (h *Hosts) Loaded() bool { return h.domains.Load() != nil }

// Route maps a request's Host header to the domain it serves: "" with
// tenant "" for the default domain, or a custom domain and the tenant that
// holds it; ok is false for a host that is neither. A default host stays
// the default domain's even if a tenant holds a domain of its name. Before
// the custom domains were first set only default hosts are served.
func (h *Hosts) Route(hostport string) (domain, tenant string, ok bool) {
	host := linkdomain.Host(hostport)
	if _, ok := h.defaults[host]; ok {
		return "", "", true
	}
	domains := h.domains.Load()
	if domains == nil {
		return "", "", false
	}
	if t, ok := (*domains)[host]; ok {
		return host, t, true
	}
	return "", "", h.defaults == nil
}

// route is the key of code requested on hostport and the tenant that holds
// that host ("" for the default domain); known is false for a host the
// redirect does not serve.
func (h *Handler) route(hostport, code string) (key, tenant string, known bool) {
	if h.hosts == nil {
		return code, "", true
	}
	domain, tenant, known := h.hosts.Route(hostport)
	return linkdomain.Key(domain, code), tenant, known
}
