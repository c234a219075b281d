package redirector

import (
	"net/http"
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

// OriginForm answers 400 to a request whose request line names a scheme or
// a host (absolute-form, "GET http://example.com/abcd HTTP/1.1"), and
// passes every other request to next. Go's server takes the host of such a
// line as the request's (RFC 9112 section 3.2.2: the Host header is
// ignored then) and drops the Host header before any handler runs, so the
// redirect cannot route on that header, nor tell whether it names the same
// host. Routed on the line's host, a cache in front that keys on the Host
// header, behind a proxy that forwards such lines as they are, could keep
// one domain's answer (a custom domain's link, a 508) under another's
// name. No client sends this form but to a forward proxy, which kurz is
// not, so every request of it is refused. It wraps the whole public mux
// once; the routes read r.Host knowing it is the Host header. The check
// is two string lengths per request.
func OriginForm(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Host != "" || r.URL.Scheme != "" {
			writePage(w, http.StatusBadRequest, pages[statusAbsoluteForm])
			return
		}
		next.ServeHTTP(w, r)
	})
}
