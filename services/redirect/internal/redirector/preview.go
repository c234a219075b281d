package redirector

import (
	"bytes"
	"context"
	_ "embed"
	"html/template"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/pkg/urlnorm"
	"kurz.dev/services/redirect/internal/resolve"
)

// A link's preview is GET or HEAD /{code}+, as Bitly and YOURLS answer it:
// a page naming where the link leads, for someone who wants to know before
// following it. '+' is no code character (linkcode.Plausible), so "code+"
// can never be a code itself: it is always the preview of code, and the
// redirect's hot path, which only ever sees plausible codes, does not look
// for it.
//
// A preview is looked up as its redirect is (route, resolver, walk bound,
// limiter) and answers as the redirect does for every link that does not
// redirect (404, 410 for a disabled, expired, exhausted or suspended one,
// 508 for a loop), so it reveals nothing the redirect would not. It never
// records a click nor spends a visit, and so names no destination that
// only a counted visit reveals: a protected link's page says it asks a
// password, a visit-limited link's that it is limited (the redirect's HEAD
// and preview fetchers get no Location for either). Any other link's page
// names the destination the redirect would send this very request to (its
// rule, device target, variant or URL, chosen as the redirect chooses), and
// for a link with rules, variants or device targets says that others may
// be sent elsewhere: never a rule's URL meant for another audience (an
// office network's intranet page, a country's offer), nor a URL that its
// variants keep every visitor from.
//
// The page's one link is the short link itself, not the destination: the
// visit that follows is counted, and meets the password, the visit limit
// and the rules, as any other.

//go:embed preview.html
var previewHTML string

var previewTemplate = template.Must(template.New("preview").Parse(previewHTML))

// previewPage is the template's data: the code (plausible, and escaped
// anyway), the short link's path with the request's query (formAction:
// bounded, and never off the code's path) and the destination, escaped by
// the template. Nothing else from the request reaches the page.
type previewPage struct {
	Style     template.CSS
	Code      string
	Href      string
	URL       string
	Protected bool
	Limited   bool
	Varies    bool
}

// previewCSP lets the page load nothing but its style, be framed by no one,
// and post nowhere; its link is an ordinary navigation, which no CSP
// directive governs.
var previewCSP = "default-src 'none'; style-src " + formStyleHash +
	"; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"

// previewOf returns the code whose preview path is the request's code
// ("abcd+" previews "abcd"), and whether it is one.
func previewOf(code string) (string, bool) {
	base, ok := strings.CutSuffix(code, "+")
	return base, ok && linkcode.Plausible(base)
}

// shownURL is target as the page shows it: all ASCII, the host in
// punycode and every other non-ASCII byte percent-encoded, as the
// redirect's Location (asciiURL). The shortener stores URLs so, but the
// page does not rely on an entry having been written by it: shown as text,
// a Unicode host can be a homograph of another ("\u0430pple.com" with a
// Cyrillic "\u0430"), and a bidi control (U+202E) reorders what follows
// it. A target of ASCII, nearly every one, is returned as it is.
func shownURL(target string) string {
	if !strings.ContainsFunc(target, func(r rune) bool { return r >= utf8.RuneSelf }) {
		return target
	}
	// The authority as pointsBack reads it: after the scheme, up to the
	// path, past any user info.
	if scheme, rest, ok := strings.Cut(target, "://"); ok {
		end := len(rest)
		if i := strings.IndexAny(rest, "/?#\\"); i >= 0 {
			end = i
		}
		start := strings.LastIndexByte(rest[:end], '@') + 1
		if h, port := splitHostPort(rest[start:end]); h != "" {
			if host, err := urlnorm.Host(h); err == nil {
				if strings.Contains(host, ":") {
					host = "[" + host + "]"
				}
				if port != "" {
					host += ":" + port
				}
				target = scheme + "://" + rest[:start] + host + rest[end:]
			}
		}
	}
	return asciiURL(target)
}

// servePreview answers GET and HEAD /{code}+ (see above) and counts the
// answer in kurz.redirect.previews, not in the redirect's requests.
func (h *Handler) servePreview(w http.ResponseWriter, r *http.Request, code string, start time.Time) {
	lk, c, e, _, status := h.lookup(w, r, code)
	if status == 0 {
		status = h.preview(w, r, lk, c, e, start)
	}
	h.previews.Add(r.Context(), 1, metric.WithAttributes(attribute.Int("status", status)))
}

// preview answers the preview of lk, whose entry is e, asked by c, and
// returns the status.
func (h *Handler) preview(w http.ResponseWriter, r *http.Request, lk link, c client, e linkcache.Entry, start time.Time) int {
	if status, done := h.inactive(w, e, start); done {
		return status
	}
	ctx := r.Context()
	if e.MaxVisits > 0 {
		// Read, never counted: as the redirect does, a spent link is 410
		// before anything else, and an unreadable counter is 503 unless a
		// password comes first (the redirect shows its form then).
		left, err := h.visitsLeft(ctx, lk.key, e.MaxVisits)
		switch {
		case err == nil && !left:
			page(w, http.StatusGone)
			return http.StatusGone
		case err != nil && e.PasswordHash == "":
			if n, ok := h.visitLogs.Allow(); ok {
				h.log.WarnContext(ctx, "visit counter unreadable", "code", lk.key, "failures_not_logged", n, "err", err)
			}
			return h.unavailable(w)
		}
	}
	// The link carries the request's query, as the password form's action
	// does: the destination shown is chosen for it (a rule on a query
	// parameter), and following the link must meet the same choice.
	p := previewPage{Style: formStyle, Code: lk.code, Href: formAction(lk.code, r.URL.RawQuery), Protected: e.PasswordHash != ""}
	p.Limited = !p.Protected && e.MaxVisits > 0
	if !p.Protected && !p.Limited {
		// The redirect's own choice for this request, loop check included:
		// what it shows is what following the link would do.
		d := h.destination(r, r.UserAgent(), lk.key, c, e, start)
		if pointsBack(r.Host, d.url) {
			return loopPage(w)
		}
		p.URL, p.Varies = shownURL(d.url), e.Rules != nil || e.Targets != nil
	}
	var body bytes.Buffer
	if err := previewTemplate.Execute(&body, p); err != nil {
		page(w, http.StatusInternalServerError)
		return http.StatusInternalServerError
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	// As the redirect's answers: kept by no shared cache, so a disabled or
	// edited link's preview changes at once; not at all for the links
	// whose redirect is not kept either.
	if p.Protected || p.Limited {
		hdr["Cache-Control"] = ccNoStore
	} else {
		hdr["Cache-Control"] = ccPrivate
	}
	hdr.Set("Content-Security-Policy", previewCSP)
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("X-Robots-Tag", "noindex, nofollow")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body.Bytes())
	return http.StatusOK
}

// lookup is the lookup of a password attempt or a preview, off the
// redirect's hot path: it routes r's host, resolves code's entry through
// the walk bound and the limiter, and returns the link, its client and
// entry, and the source that answered. A status other than 0 means it
// answered the request (an unknown host, a refused lookup) with it.
func (h *Handler) lookup(w http.ResponseWriter, r *http.Request, code string) (link, client, linkcache.Entry, string, int) {
	ctx := r.Context()
	key, tenant, known := h.route(r.Host, code)
	if !known {
		hostPage(w)
		return link{}, client{}, linkcache.Entry{}, "none", http.StatusNotFound
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attribute.String("kurz.code", key))
	}
	addr := h.cfg.Clients.Client(r)
	ip := h.cfg.Keying.Key(addr)
	res, err := h.resolver.Resolve(ctx, key, func(ctx context.Context, tier resolve.Tier) error { return h.gate(ctx, ip, key, tier) })
	if err != nil {
		return link{}, client{}, linkcache.Entry{}, "none", h.refuse(w, err)
	}
	w.Header()["X-Source"] = sourceHeader(res.Source)
	return link{key: key, code: code}, client{addr, ip}, foreign(res.Entry, tenant), string(res.Source), 0
}
