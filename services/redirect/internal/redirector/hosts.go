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
// host: an unknown host costs a map lookup.
type Hosts struct {
	// defaults are the default domain's hosts; empty: every host that is
	// not a custom domain.
	defaults map[string]struct{}
	domains  atomic.Pointer[map[string]string]
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
	empty := map[string]string{}
	h.domains.Store(&empty)
	return h
}

// SetDomains replaces the custom domains: verified domain name -> the
// tenant that holds it. The map must not change afterwards.
func (h *Hosts) SetDomains(domains map[string]string) {
	h.domains.Store(&domains)
}

// Domains returns how many custom domains are served.
func (h *Hosts) Domains() int {
	return len(*h.domains.Load())
}

// Route maps a request's Host header to the domain it serves: "" with
// tenant "" for the default domain, or a custom domain and the tenant that
// holds it; ok is false for a host that is neither. A default host stays
// the default domain's even if a tenant holds a domain of its name.
func (h *Hosts) Route(hostport string) (domain, tenant string, ok bool) {
	host := linkdomain.Host(hostport)
	if _, ok := h.defaults[host]; ok {
		return "", "", true
	}
	if t, ok := (*h.domains.Load())[host]; ok {
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
