package redirector

import (
	"net/http"
	"time"

	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkrules"
)

// destination is where one visit goes and what chose it.
type destination struct {
	url string
	// rule and variant name the link's rule or variant that chose url;
	// both empty when the link's device target or URL did.
	rule, variant string
}

// destination picks the target of a visit to an active entry: the first of
// the link's rules that matches, else its device target for the visitor's
// device, else one of its variants (sticky per visitor), else its URL.
// Links without rules or variants pay for nothing but the device lookup
// they always paid; the country is looked up only for a rule that tests
// it, once.
func (h *Handler) destination(r *http.Request, ua, code string, c client, e linkcache.Entry, now time.Time) destination {
	rs := e.Rules
	if rs == nil {
		return destination{url: Target(e, ua)}
	}
	if rs.HasRules() {
		req := linkrules.Request{
			NowMs: now.UnixMilli(), AcceptLanguage: firstValue(r.Header, "Accept-Language"), RawQuery: r.URL.RawQuery,
			Addr: c.addr, Country: h.cfg.Country, UserAgent: ua, Classify: deviceClass,
		}
		if u, name, ok := rs.Match(&req); ok {
			return destination{url: u, rule: name}
		}
	}
	if t := deviceTarget(e, ua); t != "" {
		return destination{url: t}
	}
	if u, name, ok := rs.Pick(h.sticky.Bucket(c.key, code)); ok {
		return destination{url: u, variant: name}
	}
	return destination{url: e.URL}
}

// firstValue is h's first value of an already canonical key: Header.Get
// without canonicalising it again.
func firstValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// deviceClass is the linkrules device number of ua's class.
func deviceClass(ua string) int {
	switch DeviceOf(ua) {
	case IOS:
		return linkrules.DeviceIOS
	case Android:
		return linkrules.DeviceAndroid
	}
	return linkrules.DeviceDesktop
}
