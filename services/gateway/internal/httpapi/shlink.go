package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/buildinfo"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/pkg/linkdomain"
)

// The Shlink-compatible API (/rest/v3/..., and /rest/v2/..., the same
// since Shlink 4.0): the calls of Shlink's REST API that kurz can answer
// faithfully, with its paths, its X-Api-Key header, its ShortUrl objects
// and its problem types, so that the clients people point at a Shlink
// server (shlink-web-client, browser and Raycast extensions, Home
// Assistant, ShareX, scripts) work against kurz with another base URL and
// a kurz API key. Every call is charged to the edge quota as the kurz
// route it mirrors, and sees only the caller's links. What kurz cannot
// honour is refused by name, or ignored where Shlink ignores it too or
// the link works the same either way (docs/api.md, Shlink-compatible API).

// shlinkVersions are the API versions served: Shlink answers v2 as v3
// since 4.0 (they differed only in the problem types).
var shlinkVersions = []string{"v2", "v3"}

// shlinkKeyHeader carries the API key, as Shlink takes it.
const shlinkKeyHeader = "X-Api-Key"

// shlinkProblemType is the base of Shlink's problem types
// (https://shlink.io/api/error/short-url-not-found).
const shlinkProblemType = "https://shlink.io/api/error/"

// shlinkDate is how Shlink writes times (PHP's ATOM: RFC 3339 to the
// second, with a numeric offset).
const shlinkDate = "2006-01-02T15:04:05-07:00"

// Paging GET /rest/v3/short-urls. kurz's listing goes by page tokens, not
// offsets: page N is reached by reading the links from the first, in calls
// of up to shlinkMaxPerPage, and dropping those before it.
const (
	shlinkDefaultPerPage = 10   // Shlink's default
	shlinkMaxPerPage     = 1000 // ListLinks's largest page
	// shlinkMaxSkip bounds the links read and dropped before a page: at
	// most 10 calls of 1,000 links for one charged request.
	shlinkMaxSkip = 10_000
	// shlinkPageBytes bounds the links of one page (their encoded size), as
	// the shortener bounds one ListLinks page: a page is read on past the
	// shortener's early ends, so without it a page of large links would be
	// held whole (up to 1,000 URLs of 64 KiB) for one answer.
	shlinkPageBytes = 1 << 20
)

// shlinkURL is Shlink's ShortUrl object.
type shlinkURL struct {
	ShortCode   string `json:"shortCode"`
	ShortURL    string `json:"shortUrl"`
	LongURL     string `json:"longUrl"`
	DateCreated string `json:"dateCreated"`
	// VisitsSummary is left out where kurz does not count the link's
	// visits for the answer (a list's links).
	VisitsSummary *shlinkVisits `json:"visitsSummary,omitempty"`
	Tags          []string      `json:"tags"`
	Meta          shlinkMeta    `json:"meta"`
	// Domain is null on the default domain.
	Domain *string `json:"domain"`
	// Title is the link's title; null when it has none, as Shlink shows
	// a link without one.
	Title *string `json:"title"`
	// Crawlable and ForwardQuery are always false: kurz serves no
	// robots.txt allowing links, and never passes a visit's query on.
	Crawlable        bool `json:"crawlable"`
	ForwardQuery     bool `json:"forwardQuery"`
	HasRedirectRules bool `json:"hasRedirectRules"`
}

// shlinkVisits is Shlink's visitsSummary: kurz's total, its bot clicks,
// and the rest (humans, floods included) as nonBots.
type shlinkVisits struct {
	Total   int64 `json:"total"`
	NonBots int64 `json:"nonBots"`
	Bots    int64 `json:"bots"`
}

// shlinkMeta is Shlink's meta: validSince is always null (kurz links have
// no start).
type shlinkMeta struct {
	ValidSince *string `json:"validSince"`
	ValidUntil *string `json:"validUntil"`
	MaxVisits  *int64  `json:"maxVisits"`
}

// shlinkPagination is Shlink's pagination of a list.
type shlinkPagination struct {
	CurrentPage        int `json:"currentPage"`
	PagesCount         int `json:"pagesCount"`
	ItemsPerPage       int `json:"itemsPerPage"`
	ItemsInCurrentPage int `json:"itemsInCurrentPage"`
	TotalItems         int `json:"totalItems"`
}

// shlinkProblem is a refusal in Shlink's shape: kurz's problem detail
// with Shlink's type and title where Shlink has one, and the fields
// Shlink adds to it.
type shlinkProblem struct {
	problem
	// InvalidElements names the fields at fault of an invalid-data.
	InvalidElements *[]string `json:"invalidElements,omitempty"`
	ShortCode       string    `json:"shortCode,omitempty"`
	Domain          string    `json:"domain,omitempty"`
	CustomSlug      string    `json:"customSlug,omitempty"`
	ExpectedHeaders []string  `json:"expectedHeaders,omitempty"`
}

// shlinkError is a kurz error answered as one of Shlink's problem types.
type shlinkError struct {
	kind, title string // the type after shlinkProblemType, its title
	// status replaces err's status (0: err's own).
	status int
	// extra are Shlink's fields of the problem (its problem part unused).
	extra shlinkProblem
	err   error
}

func (e *shlinkError) Error() string { return e.kind + ": " + e.err.Error() }
func (e *shlinkError) Unwrap() error { return e.err }

// shlinkFail sends err in Shlink's problem shape: Shlink's type and title
// where Shlink has the refusal (invalid-data, short-url-not-found,
// non-unique-slug, invalid-api-key, missing-authentication, not-found),
// kurz's own elsewhere (a quota, a suspended tenant, an outage), with
// kurz's fields and headers (code, requestId, reason, Retry-After, the
// RateLimit fields) either way.
func (a *API) shlinkFail(c *call, err error) {
	var p shlinkProblem
	kind, title, status := "", "", 0
	var se *shlinkError
	if errors.As(err, &se) {
		kind, title, status, p, err = se.kind, se.title, se.status, se.extra, se.err
	}
	e := a.failure(c, err)
	if status != 0 {
		copied := *e
		copied.status, e = status, &copied
	}
	if kind == "" {
		kind, title = shlinkKind(e, &p)
	}
	writeShlinkProblem(c.w, c.st.id, e, kind, title, p)
}

// writeShlinkProblem sends e as a problem with p's fields, of Shlink's
// type kind (and its title) unless kind is "".
func writeShlinkProblem(w http.ResponseWriter, requestID string, e *apiError, kind, title string, p shlinkProblem) {
	p.problem = problemOf(requestID, e)
	if kind != "" {
		p.Type, p.Title = shlinkProblemType+kind, title
	}
	writeProblem(w, e, p)
}

// shlinkNotServed says what kurz serves of Shlink's REST API, to a call of
// the rest.
const shlinkNotServed = "kurz does not serve this Shlink call: it serves /rest/v3/short-urls (create, list, get, edit, delete; a link's visits answer 501), the list of /rest/v3/domains and /rest/health; tags, domain redirects, redirect rules, visits overviews and Mercure are not served (docs/api.md, Shlink-compatible API)"

// writeShlinkError sends e, a refusal under /rest/ before any route (a
// call kurz does not serve, a request too big), in Shlink's problem shape
// as shlinkFail sends a route's: a path not served is Shlink's not-found,
// as Shlink answers a route it does not have, so that its clients read it
// so.
func writeShlinkError(w http.ResponseWriter, requestID string, e *apiError) {
	var p shlinkProblem
	kind, title := shlinkKind(e, &p)
	if e.status == http.StatusNotFound {
		kind, title = "not-found", "Not found"
	}
	writeShlinkProblem(w, requestID, e, kind, title, p)
}

// shlinkKind is the Shlink problem type of a kurz refusal that has one,
// filling in its fields on p; "" for the others.
func shlinkKind(e *apiError, p *shlinkProblem) (kind, title string) {
	switch {
	case e.code == codeName(codes.Unauthenticated):
		return "invalid-api-key", "Invalid API key"
	case e.code == codeName(codes.InvalidArgument) && e.status == http.StatusBadRequest:
		names := []string{}
		for _, f := range e.fields {
			if n := shlinkFieldName(f.Field); !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
		p.InvalidElements = &names
		return "invalid-data", "Invalid data"
	}
	return "", ""
}

// shlinkFieldNames are Shlink's names of the fields kurz's services name
// in their refusals.
var shlinkFieldNames = map[string]string{
	"long_url": "longUrl", "custom_alias": "customSlug", "expire_time": "validUntil", "max_visits": "maxVisits",
	"tags": "tags", "tag": "tags", "domain": "domain", "mode": "findIfExists", "page_size": "itemsPerPage",
	"page_token": "page", "title": "title",
}

// shlinkFieldName is Shlink's name of a field a refusal names: a
// service's (long_url, link.long_url, tags[2]), or the API's own as is.
func shlinkFieldName(field string) string {
	base := strings.TrimPrefix(field, "link.")
	if i := strings.IndexByte(base, '['); i > 0 {
		base = base[:i]
	}
	if n, ok := shlinkFieldNames[base]; ok {
		return n
	}
	return field
}

// authenticateShlink resolves the tenant of the call's X-Api-Key, through
// authenticateKey like every other way of sending a key: the same
// brute-force rule, failure counting and suspended tenants.
func (a *API) authenticateShlink(c *call) error {
	if q, _ := url.ParseQuery(c.r.URL.RawQuery); q.Has("apiKey") {
		// Shlink's old GET /short-urls/shorten took the key in the URL.
		return badParameter("apiKey", "the API key is in the URL, where proxies and access logs keep it: send it in the X-Api-Key header, and consider this key exposed (revoke it and issue another)")
	}
	vs := c.r.Header.Values(shlinkKeyHeader)
	if len(vs) == 0 {
		e := &shlinkError{kind: "missing-authentication", title: "Invalid authorization",
			err: unauthenticated(`an API key is required: send a kurz API key in the X-Api-Key header`, "")}
		e.extra.ExpectedHeaders = []string{shlinkKeyHeader}
		return e
	}
	key := strings.TrimSpace(vs[0])
	return a.authenticateKey(c, key, len(vs) == 1 && key != "" && !strings.ContainsAny(key, " \t"),
		"X-Api-Key must be one kurz API key, sent once")
}

// CORS for the Shlink API. Shlink's web client is a page of another
// origin than the server (app.shlink.io, or a host of its own) and calls
// it from the browser, as Shlink allows any origin to: without CORS the
// browser refuses its first call (the health check) and the client calls
// the server unreachable. Any origin is allowed, never with credentials:
// the API key is the credential, sent by the page that holds it, and a
// request under /rest/ carries nothing a browser adds on its own (no
// cookie, no Authorization the Shlink API reads), so another site's page
// can do nothing here that it could not do without the browser. kurz's own
// API (/v1/...) answers no CORS: its anonymous creation is kept from other
// sites' pages (crossSite).
const (
	// shlinkPrefix is the Shlink API's paths.
	shlinkPrefix = "/rest/"
	// shlinkPreflightRoute labels a CORS preflight in metrics and logs.
	shlinkPreflightRoute = "OPTIONS /rest/"
)

// shlinkCORS lets any origin read an answer under /rest/, refusals
// included (a client must read why it was refused), and the fields a
// client paces itself by.
func shlinkCORS(h http.Header) {
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Expose-Headers", "RateLimit, RateLimit-Policy, Retry-After, X-Request-ID")
}

// shlinkPreflight answers a CORS preflight under /rest/: the methods and
// request fields the Shlink API takes, for an hour. It asks for no key
// (browsers send none on a preflight) and charges nothing: it does no
// work, and the request it clears is checked and charged as any other.
// The middleware has set shlinkCORS's fields already, on every answer
// under /rest/.
func shlinkPreflight(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Access-Control-Allow-Methods", "GET, POST, PATCH, DELETE")
	h.Set("Access-Control-Allow-Headers", shlinkKeyHeader+", Content-Type, X-Request-ID")
	h.Set("Access-Control-Max-Age", "3600")
	w.WriteHeader(http.StatusNoContent)
}

// shlinkVersioned refuses, before h runs, an API version kurz does not
// answer, as Shlink does: no such route (after the call was admitted and
// charged, on the routes with a key).
func shlinkVersioned(h func(*call) error) func(*call) error {
	return func(c *call) error {
		if !slices.Contains(shlinkVersions, c.r.PathValue("version")) {
			return &shlinkError{kind: "not-found", title: "Not found",
				err: notFound("this API version is not served: kurz answers Shlink's REST API at /rest/v3 (and /rest/v2, the same)")}
		}
		return h(c)
	}
}

// shlinkHealth is GET /rest/health: pass (200) while the gateway is ready,
// fail (503) otherwise, from its readiness checks' last result (no call
// of its own), and kurz's version.
func (a *API) shlinkHealth(c *call) error {
	status, code := "pass", http.StatusOK
	if a.ready != nil && !a.ready() {
		status, code = "fail", http.StatusServiceUnavailable
	}
	b, err := json.Marshal(map[string]string{"status": status, "version": buildinfo.Get().Version})
	if err != nil {
		return internalError(err)
	}
	send(c.w, code, "application/health+json", append(b, '\n'))
	return nil
}

// shlinkQuery reads the query string. Shlink ignores parameters it does
// not know, and so does this API (clients send their own); each of names
// (a parameter the route reads) must be text and given once, but for
// tags[].
func shlinkQuery(c *call, names ...string) (url.Values, error) {
	q, err := url.ParseQuery(c.r.URL.RawQuery)
	if err != nil {
		return nil, badRequest("the query string is malformed: " + strings.TrimPrefix(err.Error(), "invalid URL escape "))
	}
	for _, name := range names {
		vs := q[name]
		if len(vs) > 1 && name != "tags[]" {
			return nil, badParameter(name, fmt.Sprintf("query parameter %q is given %d times", name, len(vs)))
		}
		for _, v := range vs {
			if !isText(v) {
				return nil, badParameter(name, fmt.Sprintf("query parameter %q must be UTF-8 text without control characters", name))
			}
		}
	}
	return q, nil
}

// shlinkTarget is the link a path names: its short code, and its custom
// domain from ?domain= (the default domain without).
func shlinkTarget(c *call) (code, domain string, err error) {
	q, err := shlinkQuery(c, "domain")
	if err != nil {
		return "", "", err
	}
	code, domain = c.r.PathValue("shortCode"), q.Get("domain")
	if len(domain) > linkdomain.MaxInput {
		return "", "", badParameter("domain", "domain is too long: at most 253 characters")
	}
	if !linkcode.Plausible(code) {
		// Nothing kurz issued: not found, as Shlink answers, without the
		// code (up to the request line's 8 KiB) repeated.
		return "", "", shlinkNotFound("", domain)
	}
	return code, domain, nil
}

// shlinkNotFound is Shlink's short-url-not-found of code (repeated when
// it is one kurz could have issued) on domain.
func shlinkNotFound(code, domain string) error {
	msg := "no such link: check the code (links of other tenants are not visible)"
	if code != "" {
		msg = fmt.Sprintf("No URL found with short code %q", code)
		if domain != "" {
			msg += fmt.Sprintf(" for domain %q", domain)
		}
	}
	e := &shlinkError{kind: "short-url-not-found", title: "Short URL not found", err: notFound(msg)}
	e.extra.ShortCode, e.extra.Domain = code, domain
	return e
}

// shlinkLinkError turns a service's NOT_FOUND of the link code on domain
// into Shlink's short-url-not-found; other errors are as they are.
func shlinkLinkError(err error, code, domain string) error {
	if toAPIError(err).code == codeName(codes.NotFound) {
		return shlinkNotFound(code, domain)
	}
	return err
}

// shlinkGet is GET /rest/v3/short-urls/{shortCode}, charged as GET
// /v1/links/{code}: the link, with its visitsSummary (one statistics call,
// charged as statsRoute).
func (a *API) shlinkGet(c *call) error {
	code, domain, err := shlinkTarget(c)
	if err != nil {
		return err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.shortener.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code, Domain: domain})
	if err != nil {
		return shlinkLinkError(err, code, domain)
	}
	writeJSON(c.w, http.StatusOK, shlinkURLOf(resp.GetLink(), a.shlinkSummary(c, resp.GetLink())))
	return nil
}

// shlinkDelete is DELETE /rest/v3/short-urls/{shortCode}, charged as
// DELETE /v1/links/{code}: 204. Shlink's threshold of visits past which a
// link cannot be deleted does not exist in kurz.
func (a *API) shlinkDelete(c *call) error {
	code, domain, err := shlinkTarget(c)
	if err != nil {
		return err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	if _, err := a.shortener.DeleteLink(ctx, &shortenerv1.DeleteLinkRequest{Code: code, Domain: domain}); err != nil {
		return shlinkLinkError(err, code, domain)
	}
	c.w.Header().Set("Cache-Control", "no-store")
	c.w.WriteHeader(http.StatusNoContent)
	return nil
}

// shlinkVisitsList is GET /rest/v3/short-urls/{shortCode}/visits, charged
// as GET /v1/links/{code}/stats: refused, as kurz keeps counts of clicks
// (analytics' rollups), not a list of visits to page through; an empty
// list would say the link had none.
func (a *API) shlinkVisitsList(*call) error {
	return newError(http.StatusNotImplemented, codeName(codes.Unimplemented),
		"kurz does not list a link's visits one by one: it keeps counts. The visitsSummary of GET /rest/v3/short-urls/{shortCode} has the link's totals; GET /v1/links/{code}/stats its counts by hour or day, referrer, browser, device and country")
}

// shlinkDomain is Shlink's Domain: a domain's name, whether it is the
// default domain, and its not-found redirects.
type shlinkDomain struct {
	Domain    string                `json:"domain"`
	IsDefault bool                  `json:"isDefault"`
	Redirects shlinkDomainRedirects `json:"redirects"`
}

// shlinkDomainRedirects are Shlink's not-found redirects of a domain:
// always null, as kurz has none per domain. The redirect service's
// KURZ_REDIRECT_HOME_URL is the default domain's base URL redirect in
// Shlink's terms, but it is the redirect's setting, which the gateway does
// not know; null says "none configured here", which clients show as such.
type shlinkDomainRedirects struct {
	BaseURLRedirect         *string `json:"baseUrlRedirect"`
	Regular404Redirect      *string `json:"regular404Redirect"`
	InvalidShortURLRedirect *string `json:"invalidShortUrlRedirect"`
}

// shlinkDomains is GET /rest/v3/domains, charged as GET /v1/domains: the
// default domain first (isDefault, named by Options.DefaultDomain, the
// host its short URLs carry), then the caller's verified custom domains,
// by name, as ListDomains gives them. A domain still waiting for its DNS
// check takes no links, and Shlink's clients offer every listed domain
// for new links, so it is left out. Redirects are all null
// (shlinkDomainRedirects).
func (a *API) shlinkDomains(c *call) error {
	if _, err := shlinkQuery(c); err != nil {
		return err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.shortener.ListDomains(ctx, &shortenerv1.ListDomainsRequest{})
	if err != nil {
		return err
	}
	var out struct {
		Domains struct {
			Data             []shlinkDomain        `json:"data"`
			DefaultRedirects shlinkDomainRedirects `json:"defaultRedirects"`
		} `json:"domains"`
	}
	out.Domains.Data = []shlinkDomain{{Domain: a.opts.DefaultDomain, IsDefault: true}}
	for _, d := range resp.GetDomains() {
		if d.GetVerified() {
			out.Domains.Data = append(out.Domains.Data, shlinkDomain{Domain: d.GetName()})
		}
	}
	writeJSON(c.w, http.StatusOK, out)
	return nil
}

// shlinkSummary is l's visitsSummary (lifetimeCounts); nil, and the field
// left out, when analytics cannot tell: the link is answered all the same.
// It is charged to the edge quota as statsRoute first: a statistics query
// over up to 400 days is that route's work, whichever call answers it, and
// a rule on it must hold here too. When that charge is refused, the field
// is left out as well, analytics not asked.
func (a *API) shlinkSummary(c *call, l *shortenerv1.Link) *shlinkVisits {
	if err := a.edgeQuota(c, statsRoute); err != nil {
		return nil
	}
	counts, err := a.lifetimeCounts(c, l)
	if err != nil {
		a.summaryLeftOut(c, err)
		return nil
	}
	return shlinkVisitsOf(counts)
}

// shlinkVisitsOf is counts as Shlink's visitsSummary.
func shlinkVisitsOf(counts *analyticsv1.ClickCounts) *shlinkVisits {
	return &shlinkVisits{Total: counts.GetTotal(), NonBots: counts.GetTotal() - counts.GetBot(), Bots: counts.GetBot()}
}

// summaryLeftOut logs why visitsSummary was left out when analytics failed
// (a client's own cancellation or a refusal of the request is no news).
func (a *API) summaryLeftOut(c *call, err error) {
	if e := toAPIError(err); e.status >= 500 && e.status != 499 {
		a.log.WarnContext(c.r.Context(), "visits summary left out", "route", c.st.route, "request_id", c.st.id, "err", err)
	}
}

// shlinkSummaries are the visitsSummary of a list's links, by link key
// (linkdomain.Key), from one GetLinksClickCounts call for the whole page:
// each link's lifetime counts as shlinkSummary's, over one range from the
// oldest link's creation up to now, the last 400 days at most (codes are
// never reused, so a younger link has no clicks before its own creation).
// The page is charged as statsRoute, once per countsPerCharge links
// (a page of up to 100 as one link's summary is). nil, and every link without its
// visitsSummary, when that charge is refused or analytics cannot tell in
// the call's time: the page is answered all the same, as one link is.
// Left out, not zeros: a zero says the link had no visits, and Shlink's
// clients show what the field says.
//
// The charge is taken before analytics is asked, so that a refused one
// spares analytics the work, and a charge cannot be refunded; but an
// analytics older than the gateway (a rolling upgrade) answers every page
// UNIMPLEMENTED, and a key would pay for counts it never gets. So once the
// gateway has seen that answer, it asks analytics first (UNIMPLEMENTED
// costs analytics nothing) and charges only a page whose counts came,
// leaving them out if the charge is refused; an answer puts it back to
// charging first. Only the page that learns analytics is older pays for
// nothing, once per change.
func (a *API) shlinkSummaries(c *call, links []*shortenerv1.Link) map[string]*shlinkVisits {
	if len(links) == 0 || a.analytics == nil {
		return nil
	}
	cost := countsCharges(len(links))
	chargeFirst := !a.countsUnimplemented.Load()
	if chargeFirst {
		if err := a.edgeQuotaCost(c, statsRoute, cost); err != nil {
			return nil
		}
	}
	now := time.Now()
	oldest := now
	refs := make([]*analyticsv1.LinkRef, len(links))
	for i, l := range links {
		refs[i] = &analyticsv1.LinkRef{Code: l.GetCode(), Domain: l.GetDomain()}
		if t := l.GetCreateTime().AsTime(); t.Before(oldest) {
			oldest = t
		}
	}
	start := lifetimeStart(oldest, now)
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.analytics.GetLinksClickCounts(ctx, &analyticsv1.GetLinksClickCountsRequest{
		Links: refs, StartTime: timestamppb.New(start), EndTime: timestamppb.New(now)})
	if status.Code(err) == codes.Unimplemented {
		// An analytics older than the gateway (a rolling upgrade) answers
		// every page so: one warning says it, not one a page (nor one each
		// time a mixed fleet's answers change).
		a.countsUnimplemented.Store(true)
		if a.countsWarned.CompareAndSwap(false, true) {
			a.log.WarnContext(c.r.Context(), "analytics does not serve GetLinksClickCounts (older than this gateway): Shlink lists carry no visitsSummary until it is upgraded, and are not charged for it; logged once",
				"route", c.st.route, "request_id", c.st.id, "err", err)
		}
		return nil
	}
	if err != nil {
		a.summaryLeftOut(c, err)
		return nil
	}
	if !chargeFirst {
		a.countsUnimplemented.Store(false)
		if err := a.edgeQuotaCost(c, statsRoute, cost); err != nil {
			return nil
		}
	}
	out := make(map[string]*shlinkVisits, len(resp.GetLinks()))
	for _, lc := range resp.GetLinks() {
		out[linkdomain.Key(lc.GetDomain(), lc.GetCode())] = shlinkVisitsOf(lc.GetCounts())
	}
	return out
}

// shlinkURLOf is l as Shlink's ShortUrl, with visits as its visitsSummary
// (nil: left out).
func shlinkURLOf(l *shortenerv1.Link, visits *shlinkVisits) shlinkURL {
	u := shlinkURL{
		ShortCode: l.GetCode(), ShortURL: l.GetShortUrl(), LongURL: l.GetLongUrl(),
		DateCreated: l.GetCreateTime().AsTime().UTC().Format(shlinkDate), VisitsSummary: visits,
		Tags:             append([]string{}, l.GetTags()...),
		HasRedirectRules: len(l.GetRules()) > 0 || len(l.GetVariants()) > 0 || l.GetDeviceTargets() != nil,
	}
	if d := l.GetDomain(); d != "" {
		u.Domain = &d
	}
	if t := l.GetTitle(); t != "" {
		u.Title = &t
	}
	if l.ExpireTime != nil {
		s := l.GetExpireTime().AsTime().UTC().Format(shlinkDate)
		u.Meta.ValidUntil = &s
	}
	if n := l.GetMaxVisits(); n > 0 {
		u.Meta.MaxVisits = &n
	}
	return u
}

// shlinkList is GET /rest/v3/short-urls, charged as GET /v1/links once per
// 1,000 links it reads up to the end of its page (once more per read the
// shortener ends early), as reading them through GET /v1/links is: the
// caller's links newest first (Shlink's default order), itemsPerPage of
// them (10 by default, at most 1,000) from page (1 by default), with one
// tag at most. Shlink's filters kurz cannot apply are refused by name, not
// ignored: the page would hold links they leave out. kurz counts no
// totals: on a page with more after it, pagesCount and totalItems say at
// least one more page and one more link (currentPage + 1, the links up to
// this page + 1); on the last page they are exact. A page whose links
// take more than shlinkPageBytes is refused, naming itemsPerPage. The
// links carry their visitsSummary, from one statistics call for the page
// (shlinkSummaries).
func (a *API) shlinkList(c *call) error {
	q, err := shlinkQuery(c, "page", "itemsPerPage", "tags[]", "tagsMode", "searchTerm", "orderBy", "startDate", "endDate",
		"excludeMaxVisitsReached", "excludePastValidUntil", "domain")
	if err != nil {
		return err
	}
	page, err := shlinkCount(q, "page", 1, 1, shlinkMaxSkip+1)
	if err != nil {
		return err
	}
	perPage, err := shlinkCount(q, "itemsPerPage", shlinkDefaultPerPage, 1, shlinkMaxPerPage)
	if err != nil {
		return err
	}
	tag, err := shlinkListFilters(q)
	if err != nil {
		return err
	}
	skip := (page - 1) * perPage
	if skip > shlinkMaxSkip {
		return badParameter("page", fmt.Sprintf("page %d of %d links starts past the first %d links, the deepest this API pages: narrow the list with tags[], or page through GET /v1/links with its page tokens",
			page, perPage, shlinkMaxSkip))
	}
	list := func(size int, token string) (*shortenerv1.ListLinksResponse, error) {
		ctx, cancel := a.downstream(c)
		defer cancel()
		return a.shortener.ListLinks(ctx, &shortenerv1.ListLinksRequest{PageSize: int32(size), PageToken: token, Tag: tag})
	}
	// The call is charged as the GET /v1/links calls that would read the
	// same links, one per shlinkMaxPerPage up to the end of the page (the
	// admission paid the first), before any is read; a call the shortener
	// ends early makes one more, charged as it is made. Were the call
	// charged once, a deep page would read up to 10,000 links (and, past
	// the shortener's early ends, many more calls) for one unit of the
	// key's quota.
	paid := 1
	charge := func(calls int) error {
		if calls <= paid {
			return nil
		}
		err := a.edgeQuotaCost(c, c.charge, uint32(calls-paid))
		paid = calls
		var e *apiError
		if errors.As(err, &e) && e.status == http.StatusBadRequest {
			return badParameter("page", e.message) // more than the key's rule ever holds
		}
		return err
	}
	if err := charge((skip + perPage + shlinkMaxPerPage - 1) / shlinkMaxPerPage); err != nil {
		return err
	}
	// The links up to the end of the page, read on past the pages the
	// shortener ends early (their links past 1 MiB): a page answered short
	// would have the next page start past the links it left out.
	var (
		token     string
		read      int // links read, the page's included
		pageBytes int // the page's links, encoded
		links     []*shortenerv1.Link
		more      = true
	)
	for calls := 1; read < skip+perPage && more; calls++ {
		if err := charge(calls); err != nil {
			return err
		}
		resp, err := list(min(skip+perPage-read, shlinkMaxPerPage), token)
		if err != nil {
			return err
		}
		got := resp.GetLinks()
		for _, l := range got[min(max(skip-read, 0), len(got)):] {
			if pageBytes += proto.Size(l); len(links) > 0 && pageBytes > shlinkPageBytes {
				return badParameter("itemsPerPage", fmt.Sprintf("the links of page %d take more than %d bytes at %d a page: ask fewer itemsPerPage", page, shlinkPageBytes, perPage))
			}
			links = append(links, l)
		}
		read += len(got)
		token, more = resp.GetNextPageToken(), resp.GetNextPageToken() != "" && len(got) > 0
	}
	total := read
	pages := (total + perPage - 1) / perPage
	if more {
		total, pages = total+1, page+1
	}
	var out struct {
		ShortURLs struct {
			Data       []shlinkURL      `json:"data"`
			Pagination shlinkPagination `json:"pagination"`
		} `json:"shortUrls"`
	}
	out.ShortURLs.Data = make([]shlinkURL, 0, len(links))
	visits := a.shlinkSummaries(c, links)
	for _, l := range links {
		out.ShortURLs.Data = append(out.ShortURLs.Data, shlinkURLOf(l, visits[linkdomain.Key(l.GetDomain(), l.GetCode())]))
	}
	out.ShortURLs.Pagination = shlinkPagination{CurrentPage: page, PagesCount: pages, ItemsPerPage: perPage,
		ItemsInCurrentPage: len(links), TotalItems: total}
	writeJSON(c.w, http.StatusOK, out)
	return nil
}

// shlinkCount reads the whole number q gives name, from low to high; def
// when it is absent or empty.
func shlinkCount(q url.Values, name string, def, low, high int) (int, error) {
	s := q.Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < low || n > high {
		return 0, badParameter(name, fmt.Sprintf("%s must be a whole number from %d to %d", name, low, high))
	}
	return n, nil
}

// shlinkListFilters checks the list's filters: the one tag kurz can list
// by (tags[], of which any or all is the same for one), and the rest of
// Shlink's, which kurz cannot apply, at their defaults only.
func shlinkListFilters(q url.Values) (string, error) {
	var tags []string
	for _, t := range q["tags[]"] {
		if t = strings.ToLower(strings.TrimSpace(t)); t != "" && !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	if len(tags) > 1 {
		return "", badParameter("tags", "kurz lists links by one tag at a time: send one tags[]")
	}
	switch m := q.Get("tagsMode"); m {
	case "", "any", "all":
	default:
		return "", badParameter("tagsMode", `tagsMode must be "any" or "all"`)
	}
	switch o := q.Get("orderBy"); o {
	case "", "dateCreated-DESC":
	default:
		return "", badParameter("orderBy", "kurz lists links newest first only: leave orderBy out, or send dateCreated-DESC")
	}
	// domain (Shlink 4.3: one domain's links, DEFAULT the default
	// domain's): ListLinks lists every domain's links.
	for _, name := range []string{"searchTerm", "startDate", "endDate", "domain"} {
		if q.Get(name) != "" {
			return "", badParameter(name, fmt.Sprintf("kurz cannot filter links by %s: leave it out (tags[] filters by a tag)", name))
		}
	}
	for _, name := range []string{"excludeMaxVisitsReached", "excludePastValidUntil"} {
		switch q.Get(name) {
		case "", "false":
		default:
			return "", badParameter(name, fmt.Sprintf("kurz cannot leave out links by %s: leave it out, or send false", name))
		}
	}
	if len(tags) == 0 {
		return "", nil
	}
	return tags[0], nil
}

// shlinkFields is a JSON object body, read field by field: each field is
// checked as it is read, the fields at fault gathered, as Shlink's
// invalidElements name them all at once. Fields it does not read are
// ignored, as Shlink ignores them.
type shlinkFields struct {
	m   map[string]json.RawMessage
	bad []fieldError
}

// shlinkObject reads a request body as a JSON object, refusing a key given
// twice (encoding/json would keep the last, a proxy may read the first).
func (a *API) shlinkObject(c *call) (*shlinkFields, error) {
	b, err := a.readBody(c, false)
	if err != nil {
		return nil, err
	}
	f := &shlinkFields{}
	if err := json.Unmarshal(b, &f.m); err != nil || f.m == nil {
		msg := "the body must be a JSON object"
		if err != nil {
			msg = "invalid JSON body: " + jsonProblem(err)
		}
		return nil, badRequest(msg)
	}
	// Any other key is taken (Shlink ignores the fields it does not read).
	if problem := objectKeyProblem(b, nil); problem != "" {
		return nil, badRequest("invalid JSON body: " + problem)
	}
	return f, nil
}

func (f *shlinkFields) fail(name, msg string) {
	f.bad = append(f.bad, fieldError{Field: name, Detail: msg})
}

// failed reports whether name is at fault already.
func (f *shlinkFields) failed(name string) bool {
	return slices.ContainsFunc(f.bad, func(e fieldError) bool { return e.Field == name })
}

// err is the refusal of the fields at fault: the first's message, every
// one named.
func (f *shlinkFields) err() error {
	if len(f.bad) == 0 {
		return nil
	}
	msg := f.bad[0].Detail
	if n := len(f.bad) - 1; n > 0 {
		msg += fmt.Sprintf(" (and %d more field(s) at fault: see errors)", n)
	}
	e := badRequest(msg)
	e.fields = f.bad
	return e
}

// has reports whether the body gives name, null or not.
func (f *shlinkFields) has(name string) bool { _, ok := f.m[name]; return ok }

// null reports whether the body gives name, as null.
func (f *shlinkFields) null(name string) bool {
	raw, ok := f.m[name]
	return ok && string(raw) == "null"
}

// decode reads name into v; absent or null leave v as it is.
func (f *shlinkFields) decode(name string, v any, want string) {
	raw, ok := f.m[name]
	if !ok || string(raw) == "null" {
		return
	}
	if err := json.Unmarshal(raw, v); err != nil {
		f.fail(name, fmt.Sprintf("%s must be %s", name, want))
	}
}

// str reads name as text ("" when absent or null).
func (f *shlinkFields) str(name string) string {
	var s string
	f.decode(name, &s, "a string")
	if !isText(s) {
		f.fail(name, name+" must be UTF-8 text without control characters")
	}
	return s
}

// boolean reads name as true or false (false when absent or null).
func (f *shlinkFields) boolean(name string) bool {
	var b bool
	f.decode(name, &b, "true or false")
	return b
}

// strs reads name as a list of text (nil when absent or null).
func (f *shlinkFields) strs(name string) []string {
	var l []string
	f.decode(name, &l, "a list of strings")
	for _, s := range l {
		if !isText(s) {
			f.fail(name, name+" must hold UTF-8 text without control characters")
			break
		}
	}
	return l
}

// date reads name as an ISO 8601 time with its offset, as Shlink takes
// it (nil when absent or null).
func (f *shlinkFields) date(name string) *timestamppb.Timestamp {
	var s string
	f.decode(name, &s, "an ISO 8601 time such as 2026-01-02T15:04:05+02:00")
	if s == "" {
		return nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		f.fail(name, name+" must be an ISO 8601 time such as 2026-01-02T15:04:05+02:00")
		return nil
	}
	return timestamppb.New(t)
}

// maxVisits reads maxVisits: a whole number from 1, as Shlink takes it (0,
// kurz's none, when absent or null).
func (f *shlinkFields) maxVisits() int64 {
	var n int64
	f.decode("maxVisits", &n, "a whole number")
	if n < 0 || (n == 0 && f.has("maxVisits") && !f.null("maxVisits")) {
		f.fail("maxVisits", "maxVisits must be a whole number from 1, or null for no limit")
	}
	return n
}

// editLongURL reads name, a link's new long URL, into link when the body
// gives it, and returns mask with long_url added.
func (f *shlinkFields) editLongURL(name string, link *shortenerv1.Link, mask []string) []string {
	if !f.has(name) {
		return mask
	}
	if link.LongUrl = f.str(name); strings.TrimSpace(link.LongUrl) == "" && !f.failed(name) {
		f.fail(name, name+" must be the URL to redirect to")
	}
	return append(mask, "long_url")
}

// editTitle reads name, a link's new title ("" or null clears it), into
// link when the body gives it, and returns mask with title added.
func (f *shlinkFields) editTitle(name string, link *shortenerv1.Link, mask []string) []string {
	if !f.has(name) {
		return mask
	}
	link.Title = f.str(name)
	return append(mask, "title")
}

// editTags reads name, a link's new tags, into link when the body gives
// it, and returns mask with tags added.
func (f *shlinkFields) editTags(name string, link *shortenerv1.Link, mask []string) []string {
	if !f.has(name) {
		return mask
	}
	link.Tags = f.strs(name)
	return append(mask, "tags")
}

// noValidSince refuses a validSince: a link kurz makes works at once, and
// a link that worked before its start would not be the link asked for.
func (f *shlinkFields) noValidSince() {
	var s string
	f.decode("validSince", &s, "null")
	if s != "" {
		f.fail("validSince", "kurz links have no start time: leave validSince out (or null); validUntil is taken")
	}
}

// shlinkCreate is POST /rest/v3/short-urls, charged as POST /v1/links:
// CreateLink with longUrl, customSlug (the alias), tags, title,
// validUntil (the expiry), maxVisits and domain, answered 200 with the
// ShortUrl, as
// Shlink does. findIfExists finds the tenant's link of the URL
// (CODE_MODE_FROM_URL: a link made by findIfExists before) and answers it
// when the settings the request gives match it; else Shlink makes a new
// link, and so does this. A customSlug already taken, the caller's own
// link to the same URL included, is Shlink's non-unique-slug unless
// findIfExists finds that link as it is asked. validSince is refused;
// crawlable, forwardQuery, shortCodeLength, validateUrl and
// deviceLongUrls are ignored (Shlink 4 ignores the last two as well). A
// title over 512 characters is refused (title), where Shlink cuts it to
// 512 bytes: kurz keeps what it is sent or says why not.
func (a *API) shlinkCreate(c *call) error {
	f, err := a.shlinkObject(c)
	if err != nil {
		return err
	}
	req := &shortenerv1.CreateLinkRequest{LongUrl: f.str("longUrl"), Tags: f.strs("tags"), Title: f.str("title"),
		ExpireTime: f.date("validUntil"), MaxVisits: f.maxVisits(), Domain: f.str("domain")}
	slug, find := f.str("customSlug"), f.boolean("findIfExists")
	f.noValidSince()
	if strings.TrimSpace(req.GetLongUrl()) == "" && !f.failed("longUrl") {
		f.fail("longUrl", "longUrl is required: the URL to shorten")
	}
	if err := f.err(); err != nil {
		return err
	}
	switch {
	case slug != "":
		req.Mode, req.CustomAlias = shortenerv1.CodeMode_CODE_MODE_CUSTOM, slug
	case find:
		req.Mode = shortenerv1.CodeMode_CODE_MODE_FROM_URL
	}
	resp, err := a.shlinkCreateLink(c, req)
	if err != nil {
		return err
	}
	if !resp.GetCreated() && !(find && sameSettings(resp.GetLink(), req)) {
		if slug != "" {
			return shlinkSlugTaken(newError(http.StatusConflict, codeName(codes.AlreadyExists),
				fmt.Sprintf("the slug %q is already in use: send another customSlug, or findIfExists with the link's settings to get it back", slug)), slug, req.GetDomain())
		}
		// The URL's link has other settings: Shlink makes a new link.
		req.Mode = shortenerv1.CodeMode_CODE_MODE_SEQUENTIAL
		if resp, err = a.shlinkCreateLink(c, req); err != nil {
			return err
		}
	}
	visits := &shlinkVisits{}
	if !resp.GetCreated() {
		visits = a.shlinkSummary(c, resp.GetLink())
	}
	writeJSON(c.w, http.StatusOK, shlinkURLOf(resp.GetLink(), visits))
	return nil
}

// shlinkCreateLink is one CreateLink, a taken alias answered as Shlink's
// non-unique-slug.
func (a *API) shlinkCreateLink(c *call, req *shortenerv1.CreateLinkRequest) (*shortenerv1.CreateLinkResponse, error) {
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.shortener.CreateLink(ctx, req)
	if err != nil && req.GetCustomAlias() != "" && toAPIError(err).code == codeName(codes.AlreadyExists) {
		return nil, shlinkSlugTaken(err, req.GetCustomAlias(), req.GetDomain())
	}
	return resp, err
}

// shlinkSlugTaken is Shlink's non-unique-slug (400, where kurz says 409)
// over err; slug passed the shortener's checks, so it is short.
func shlinkSlugTaken(err error, slug, domain string) error {
	e := &shlinkError{kind: "non-unique-slug", title: "Invalid custom slug", status: http.StatusBadRequest, err: err}
	e.extra.CustomSlug, e.extra.Domain = slug, domain
	return e
}

// sameSettings reports whether the existing link l has the settings req
// gives (its tags, title, expiry and visit limit, those it gives only), as
// Shlink's findIfExists matches them; a title given and not the link's
// makes a new link, so the title sent is never dropped.
func sameSettings(l *shortenerv1.Link, req *shortenerv1.CreateLinkRequest) bool {
	if req.GetTitle() != "" && req.GetTitle() != l.GetTitle() {
		return false
	}
	if len(req.GetTags()) > 0 {
		want := make([]string, 0, len(req.GetTags()))
		for _, t := range req.GetTags() {
			if t = strings.ToLower(t); !slices.Contains(want, t) {
				want = append(want, t)
			}
		}
		got := slices.Clone(l.GetTags())
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			return false
		}
	}
	if req.ExpireTime != nil && (l.ExpireTime == nil ||
		!l.GetExpireTime().AsTime().Equal(req.GetExpireTime().AsTime().Truncate(time.Microsecond))) {
		return false
	}
	return req.GetMaxVisits() == 0 || req.GetMaxVisits() == l.GetMaxVisits()
}

// shlinkEdit is PATCH /rest/v3/short-urls/{shortCode}, charged as PATCH
// /v1/links/{code}: UpdateLink of the fields the body gives, longUrl,
// validUntil (null clears it), maxVisits (null clears it), tags and title
// (null or "" clears it; left out, it stays, as in Shlink), answered with
// the ShortUrl and its visitsSummary. validSince is refused; crawlable,
// forwardQuery, validateUrl and deviceLongUrls are ignored, as on create.
func (a *API) shlinkEdit(c *call) error {
	code, domain, err := shlinkTarget(c)
	if err != nil {
		return err
	}
	f, err := a.shlinkObject(c)
	if err != nil {
		return err
	}
	link := &shortenerv1.Link{Code: code}
	if domain != "" {
		link.Domain = &domain
	}
	mask := f.editLongURL("longUrl", link, nil)
	if f.has("validUntil") {
		link.ExpireTime = f.date("validUntil")
		mask = append(mask, "expire_time")
	}
	if f.has("maxVisits") {
		link.MaxVisits = f.maxVisits()
		mask = append(mask, "max_visits")
	}
	mask = f.editTitle("title", link, f.editTags("tags", link, mask))
	f.noValidSince()
	if err := f.err(); err != nil {
		return err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	var l *shortenerv1.Link
	if len(mask) == 0 {
		// Only fields kurz ignores: nothing to change, the link as it is.
		resp, err := a.shortener.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code, Domain: domain})
		if err != nil {
			return shlinkLinkError(err, code, domain)
		}
		l = resp.GetLink()
	} else {
		resp, err := a.shortener.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: link, UpdateMask: &fieldmaskpb.FieldMask{Paths: mask}})
		if err != nil {
			return shlinkLinkError(err, code, domain)
		}
		l = resp.GetLink()
	}
	writeJSON(c.w, http.StatusOK, shlinkURLOf(l, a.shlinkSummary(c, l)))
	return nil
}
