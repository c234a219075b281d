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
	// country is the client's country when a country condition looked it
	// up (countryKnown), so that the click does not look it up again.
	country      string
	countryKnown bool
}

// destination picks the target of a visit to an active entry: the first of
// the link's rules that matches, else its device target for the visitor's
// device, else one of its variants (sticky per visitor), else its URL.
// Links without rules or variants pay for nothing but the device lookup
// they always paid; the country is looked up for a rule that tests it at
// most once, and the click records that answer instead of asking again.
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
		var d destination
		u, name, ok := rs.Match(&req)
		d.country, d.countryKnown = req.CountryLookedUp()
		if ok {
			d.url, d.rule = u, name
		} else {
			d.url, d.variant = h.fallback(ua, code, c, e)
		}
		return d
	}
	var d destination
	d.url, d.variant = h.fallback(ua, code, c, e)
	return d
}

// fallback is the destination of a visit no rule chose: the device target,
// else a variant (its name returned), else the link's URL.
func (h *Handler) fallback(ua, code string, c client, e linkcache.Entry) (url, variant string) {
	if t := deviceTarget(e, ua); t != "" {
		return t, ""
	}
	if u, name, ok := e.Rules.Pick(h.sticky.Bucket(c.key, code)); ok {
		return u, name
	}
	return e.URL, ""
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
