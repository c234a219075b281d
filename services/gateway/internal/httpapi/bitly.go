package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/pkg/linkdomain"
)

// The Bitly-compatible API (/v4/...): the calls of Bitly's API v4 that
// kurz can answer faithfully, with its paths, its bearer token (a kurz API
// key), its field names and its error shape, so that the scripts, SDKs
// and integrations written for Bitly work against kurz with another base
// URL. Every call is charged to the edge quota as the kurz route it does
// the work of, and sees only the caller's links. A tenant is one Bitly
// group (and organization), its guid the tenant's ID. What kurz cannot
// honour is refused by name (docs/api.md, Bitly-compatible API).

// bitlyPrefix is the Bitly API's paths.
const bitlyPrefix = "/v4/"

// bitlyDate is how Bitly writes times: to the second, with a numeric
// offset without a colon (2026-03-01T10:30:00+0000).
const bitlyDate = "2006-01-02T15:04:05-0700"

// bitlyDomain is Bitly's own short domain, which Bitly's clients send as
// the default unasked: kurz's default domain. A bitlink on it names the
// caller's link of that code on the default domain (a link imported from
// Bitly keeps its code there).
const bitlyDomain = "bit.ly"

// bitlyNotServed answers a /v4/ call kurz does not serve.
const bitlyNotServed = "kurz does not serve this Bitly call: it serves /v4/shorten, /v4/bitlinks (create, get, update, delete, clicks and clicks/summary), /v4/expand, /v4/user, /v4/groups and a group's bitlinks; QR codes, custom bitlinks, deeplinks, campaigns, channels, BSDs, organizations and metrics by country, city, device or referrer are not served (docs/api.md, Bitly-compatible API)"

// Paging GET /v4/groups/{group_guid}/bitlinks: Bitly's default size, and
// ListLinks's largest page.
const (
	bitlyDefaultSize = 50
	bitlyMaxSize     = 1000
	// bitlyMaxToken bounds search_after, a ListLinks page token.
	bitlyMaxToken = 2048
)

// bitlink is Bitly's bitlink body, title left out when the link has
// none. Archived is always false (kurz archives nothing), and
// custom_bitlinks and deeplinks are always empty.
type bitlink struct {
	References     map[string]string `json:"references"`
	Link           string            `json:"link"`
	ID             string            `json:"id"`
	LongURL        string            `json:"long_url"`
	Title          string            `json:"title,omitempty"`
	Archived       bool              `json:"archived"`
	CreatedAt      string            `json:"created_at"`
	CustomBitlinks []string          `json:"custom_bitlinks"`
	Tags           []string          `json:"tags"`
	Deeplinks      []string          `json:"deeplinks"`
}

// bitlinkID is l's bitlink: its short URL without the scheme, host/code.
func bitlinkID(l *shortenerv1.Link) string {
	if u, err := url.Parse(l.GetShortUrl()); err == nil && u.Host != "" {
		return u.Host + u.Path
	}
	return linkdomain.Key(l.GetDomain(), l.GetCode())
}

// bitlinkOf is l as Bitly's bitlink, in the group (tenant) guid.
func bitlinkOf(l *shortenerv1.Link, guid string) bitlink {
	return bitlink{
		References: map[string]string{"group": bitlyPrefix + "groups/" + url.PathEscape(guid)},
		Link:       l.GetShortUrl(), ID: bitlinkID(l), LongURL: l.GetLongUrl(), Title: l.GetTitle(),
		CreatedAt:      l.GetCreateTime().AsTime().UTC().Format(bitlyDate),
		CustomBitlinks: []string{}, Tags: append([]string{}, l.GetTags()...), Deeplinks: []string{},
	}
}

// bitlinksPrefix is the paths of bitlinks, /v4/bitlinks/{domain}/{hash}.
const bitlinksPrefix = bitlyPrefix + "bitlinks/"

// bitlyPath routes a bitlink sent with its slash as %2F (Bitly's
// reference writes it so, and clients escape it) as the same path with
// the slash: the mux matches the escaped path, where %2F is no segment
// boundary. The path (decoded) is unchanged, and was checked canonical.
// It reports false for a path under /v4/bitlinks/ of one segment, which
// names no bitlink (the mux would redirect it to the path with a slash
// after it).
func bitlyPath(r *http.Request) bool {
	rest, ok := strings.CutPrefix(r.URL.Path, bitlinksPrefix)
	if !ok {
		return true
	}
	r.URL.RawPath = ""
	return strings.Contains(rest, "/")
}

// bitlyError is Bitly's error body, with kurz's code and request ID.
type bitlyError struct {
	Message     string            `json:"message"`
	Description string            `json:"description"`
	Resource    string            `json:"resource"`
	Errors      []bitlyFieldError `json:"errors,omitempty"`
	Code        string            `json:"code"`
	RequestID   string            `json:"request_id,omitempty"`
}

// bitlyFieldError names one field at fault.
type bitlyFieldError struct {
	Field     string `json:"field"`
	ErrorCode string `json:"error_code"`
}

// bitlyFail sends err in Bitly's error shape, with kurz's headers
// (Retry-After, the RateLimit fields of the edge quota's denial).
func (a *API) bitlyFail(c *call, err error) {
	writeBitlyError(c.w, c.st.id, bitlyResource(c.r.URL.Path), a.failure(c, err))
}

// bitlyResources are Bitly's resource of each call kurz serves, by the
// first segment of its path: Bitly names a shorten's "bitlinks".
var bitlyResources = map[string]string{
	"shorten": "bitlinks", "bitlinks": "bitlinks", "expand": "bitlinks", "user": "user", "groups": "groups",
}

// bitlyResource is Bitly's resource of a call to path, for its error
// body; "" for a call kurz does not serve (a path a client wrote is not
// echoed).
func bitlyResource(path string) string {
	first, _, _ := strings.Cut(strings.TrimPrefix(path, bitlyPrefix), "/")
	return bitlyResources[first]
}

// writeBitlyError sends e in Bitly's error shape: Bitly's message for the
// status (INVALID_ARG_<FIELD> for a refused field), the resource called
// (always there: Bitly's SDKs tell its errors by message and resource),
// kurz's message as the description.
func writeBitlyError(w http.ResponseWriter, requestID, resource string, e *apiError) {
	w.Header().Set("Cache-Control", "no-store")
	errorHeaders(w.Header(), e)
	status, message := bitlyStatus(e)
	body := bitlyError{Message: message, Description: e.message, Resource: resource, Code: e.code, RequestID: requestID}
	for _, f := range e.fields {
		name := bitlyFieldName(f.Field)
		if !slices.ContainsFunc(body.Errors, func(b bitlyFieldError) bool { return b.Field == name }) {
			body.Errors = append(body.Errors, bitlyFieldError{Field: name, ErrorCode: "invalid"})
		}
	}
	b, err := json.Marshal(body)
	if err != nil {
		writeError(w, requestID, internalError(err))
		return
	}
	send(w, status, "application/json", append(b, '\n'))
}

// bitlyMessages are Bitly's messages of the statuses it answers.
var bitlyMessages = map[int]string{
	http.StatusForbidden: "FORBIDDEN", http.StatusNotFound: "NOT_FOUND", http.StatusMethodNotAllowed: "METHOD_NOT_ALLOWED",
	http.StatusConflict: "ALREADY_EXISTS", http.StatusUnprocessableEntity: "UNPROCESSABLE_ENTITY",
	http.StatusTooManyRequests: "RATE_LIMIT_EXCEEDED", http.StatusNotImplemented: "NOT_IMPLEMENTED",
	http.StatusServiceUnavailable: "TEMPORARILY_UNAVAILABLE",
}

// bitlyStatus is the status and Bitly's message of e: Bitly answers a
// missing or wrong token 403 FORBIDDEN, as it does a group of another
// user.
func bitlyStatus(e *apiError) (int, string) {
	status := e.status
	if status == http.StatusUnauthorized {
		status = http.StatusForbidden
	}
	msg, ok := bitlyMessages[status]
	switch {
	case status == http.StatusBadRequest && len(e.fields) > 0:
		msg = "INVALID_ARG_" + strings.ToUpper(bitlyFieldName(e.fields[0].Field))
	case status == http.StatusBadRequest:
		msg = "BAD_REQUEST"
	case !ok && status >= 500:
		msg = "INTERNAL_ERROR"
	case !ok:
		msg = strings.ToUpper(strings.ReplaceAll(http.StatusText(status), " ", "_"))
	}
	return status, msg
}

// bitlyFieldName is the Bitly name of a field a refusal names: a
// service's (long_url, link.long_url, tags[2]) or the API's own.
func bitlyFieldName(field string) string {
	base := strings.TrimPrefix(field, "link.")
	if i := strings.IndexByte(base, '['); i > 0 {
		base = base[:i]
	}
	if base == "page_token" {
		return "search_after"
	}
	return base
}

// bitlyGroup checks a group_guid a call names: the caller's tenant, or
// none; another is 403, as Bitly answers a group the token cannot use,
// whether it exists or not.
func bitlyGroup(c *call, guid string) error {
	if guid == "" || guid == c.tenant() {
		return nil
	}
	return newError(http.StatusForbidden, "PERMISSION_DENIED",
		"this API key's only group is its tenant, whose guid is default_group_guid of GET /v4/user; leave group_guid out or send that one")
}

// bitlyCreateDomain is the CreateLink domain of a Bitly domain: the
// default for none or bit.ly, else one of the tenant's verified domains
// (the shortener refuses any other, naming domain).
func bitlyCreateDomain(d string) string {
	if strings.EqualFold(d, bitlyDomain) {
		return ""
	}
	return d
}

// bitlyShorten is POST /v4/shorten and POST /v4/bitlinks, charged as POST
// /v1/links: CreateLink of long_url on domain in the code mode that finds
// the tenant's link of the URL (CODE_MODE_FROM_URL), so that a URL
// shortened again answers its link, 200, and a new one 201, as Bitly
// does. tags and title are kept on a new link (a link found keeps its
// own, as Bitly's does); deeplinks must be empty.
func (a *API) bitlyShorten(c *call) error {
	f, err := a.shlinkObject(c)
	if err != nil {
		return err
	}
	req := &shortenerv1.CreateLinkRequest{LongUrl: f.str("long_url"), Domain: bitlyCreateDomain(f.str("domain")),
		Tags: f.strs("tags"), Title: f.str("title"), Mode: shortenerv1.CodeMode_CODE_MODE_FROM_URL}
	guid := f.str("group_guid")
	bitlyNoDeeplinks(f)
	if strings.TrimSpace(req.GetLongUrl()) == "" && !f.failed("long_url") {
		f.fail("long_url", "long_url is required: the URL to shorten")
	}
	if err := f.err(); err != nil {
		return err
	}
	if err := bitlyGroup(c, guid); err != nil {
		return err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.shortener.CreateLink(ctx, req)
	if err != nil {
		return err
	}
	status := http.StatusCreated
	if !resp.GetCreated() {
		status = http.StatusOK
	}
	writeJSON(c.w, status, bitlinkOf(resp.GetLink(), c.tenant()))
	return nil
}

// bitlyNoDeeplinks refuses deeplinks that are not empty: kurz has none
// (its device targets are per link, not per app).
func bitlyNoDeeplinks(f *shlinkFields) {
	var d []json.RawMessage
	f.decode("deeplinks", &d, "a list")
	if len(d) > 0 {
		f.fail("deeplinks", "kurz has no deeplinks: leave deeplinks out (a link's deviceTargets, PATCH /v1/links/{code}, send iOS and Android visitors elsewhere)")
	}
}

// bitlinkCharge is what a GET under /v4/bitlinks/ is charged as: its
// clicks as a link's statistics, the link itself as its GET.
func bitlinkCharge(r *http.Request) string {
	if rest := r.PathValue("hash"); strings.HasSuffix(rest, "/clicks") || strings.HasSuffix(rest, "/clicks/summary") {
		return statsRoute
	}
	return "GET /v1/links/{code}"
}

// bitlinkNotFound refuses a bitlink that is not one of the caller's links,
// without repeating it.
func bitlinkNotFound() error {
	return notFound("no such bitlink: send host/code, as the id of a bitlink (links of other tenants are not visible)")
}

// bitlinkTarget is the path's bitlink, host/code (its slash sent as is
// or as %2F: see bitlyPath), and what follows it (clicks,
// clicks/summary).
func bitlinkTarget(c *call) (host, code, tail string, err error) {
	host = c.r.PathValue("domain")
	code, tail, _ = strings.Cut(c.r.PathValue("hash"), "/")
	if len(host) > linkdomain.MaxLength+len(":65535") || !linkcode.Plausible(code) {
		return "", "", "", bitlinkNotFound()
	}
	return host, code, tail, nil
}

// bitlinkOnly is bitlinkTarget of a path that names a bitlink and
// nothing after it (a PATCH's, a DELETE's).
func bitlinkOnly(c *call) (host, code string, err error) {
	host, code, tail, err := bitlinkTarget(c)
	if err == nil && tail != "" {
		err = notFound(bitlyNotServed)
	}
	return host, code, err
}

// bitlyLink finds the caller's link of bitlink host/code: on the default
// domain when host is its short URLs' host or bit.ly, else on the custom
// domain host. Not found (or a host that cannot be a domain) is 404.
func (a *API) bitlyLink(c *call, host, code string) (*shortenerv1.Link, error) {
	if strings.EqualFold(host, bitlyDomain) {
		host = ""
	}
	l, err := a.linkOnHost(c, code, host)
	if err != nil {
		if e := toAPIError(err); e.status == http.StatusNotFound || e.status == http.StatusBadRequest {
			return nil, bitlinkNotFound()
		}
		return nil, err
	}
	return l, nil
}

// bitlinkGet serves GET /v4/bitlinks/{bitlink}, charged as GET
// /v1/links/{code}, and its clicks and clicks/summary, charged as GET
// /v1/links/{code}/stats.
func (a *API) bitlinkGet(c *call) error {
	host, code, tail, err := bitlinkTarget(c)
	if err != nil {
		return err
	}
	if tail != "" && tail != "clicks" && tail != "clicks/summary" {
		return notFound(bitlyNotServed)
	}
	var q url.Values
	var r bitlyRange
	if tail != "" {
		// The parameters are checked before the link is looked up.
		if q, err = shlinkQuery(c, "unit", "units", "unit_reference"); err != nil {
			return err
		}
		if r, err = bitlyRangeOf(q); err != nil {
			return err
		}
	}
	l, err := a.bitlyLink(c, host, code)
	if err != nil {
		return err
	}
	if tail == "" {
		writeJSON(c.w, http.StatusOK, bitlinkOf(l, c.tenant()))
		return nil
	}
	return a.bitlyClicks(c, l, r, tail == "clicks/summary")
}

// bitlinkEdit is PATCH /v4/bitlinks/{bitlink}, charged as PATCH
// /v1/links/{code}: long_url, tags and title changed when given (an
// empty title clears it); archived false only (an archived Bitly link still
// redirects, kurz can only disable one, which stops it); deeplinks empty;
// the bitlink's other fields (a client sending the bitlink back) ignored;
// a field given as null is not given (bitlyOmitNulls).
func (a *API) bitlinkEdit(c *call) error {
	host, code, err := bitlinkOnly(c)
	if err != nil {
		return err
	}
	f, err := a.shlinkObject(c)
	if err != nil {
		return err
	}
	bitlyOmitNulls(f)
	link := &shortenerv1.Link{}
	mask := f.editTags("tags", link, f.editLongURL("long_url", link, nil))
	if f.boolean("archived") {
		f.fail("archived", "kurz cannot archive a link and keep it working: send archived false or leave it out (DELETE /v4/bitlinks/{bitlink} deletes it)")
	}
	mask = f.editTitle("title", link, mask)
	bitlyNoDeeplinks(f)
	if err := f.err(); err != nil {
		return err
	}
	l, err := a.bitlyLink(c, host, code)
	if err != nil {
		return err
	}
	if len(mask) > 0 {
		link.Code, link.Domain = l.GetCode(), l.Domain
		ctx, cancel := a.downstream(c)
		defer cancel()
		resp, err := a.shortener.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: link, UpdateMask: &fieldmaskpb.FieldMask{Paths: mask}})
		if err != nil {
			return err
		}
		l = resp.GetLink()
	}
	writeJSON(c.w, http.StatusOK, bitlinkOf(l, c.tenant()))
	return nil
}

// bitlyOmitNulls drops the fields f gives as null: Bitly takes a null as
// a field not given, and its clients send every field they know, null when
// unset (the Ruby gem's Bitlink#update sends the whole bitlink), which read
// as given refused a PATCH of tags (long_url null) or cleared the link's
// tags on a PATCH of long_url.
func bitlyOmitNulls(f *shlinkFields) {
	maps.DeleteFunc(f.m, func(_ string, v json.RawMessage) bool { return string(v) == "null" })
}

// bitlinkDelete is DELETE /v4/bitlinks/{bitlink}, charged as DELETE
// /v1/links/{code}: 200 with the link deleted, as Bitly answers.
func (a *API) bitlinkDelete(c *call) error {
	host, code, err := bitlinkOnly(c)
	if err != nil {
		return err
	}
	l, err := a.bitlyLink(c, host, code)
	if err != nil {
		return err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	if _, err := a.shortener.DeleteLink(ctx, &shortenerv1.DeleteLinkRequest{Code: l.GetCode(), Domain: l.GetDomain()}); err != nil {
		return err
	}
	writeJSON(c.w, http.StatusOK, map[string]any{"links_deleted": []map[string]string{{"id": bitlinkID(l), "long_url": l.GetLongUrl()}}})
	return nil
}

// bitlyExpand is POST /v4/expand, charged as GET /v1/links/{code}: the
// link of bitlink_id (host/code, with or without its scheme).
func (a *API) bitlyExpand(c *call) error {
	f, err := a.shlinkObject(c)
	if err != nil {
		return err
	}
	id := f.str("bitlink_id")
	if strings.TrimSpace(id) == "" && !f.failed("bitlink_id") {
		f.fail("bitlink_id", "bitlink_id is required: the bitlink, host/code")
	}
	if err := f.err(); err != nil {
		return err
	}
	id = strings.TrimPrefix(strings.TrimPrefix(id, "https://"), "http://")
	host, code, ok := strings.Cut(id, "/")
	if !ok || len(host) > linkdomain.MaxLength+len(":65535") || !linkcode.Plausible(code) {
		return bitlinkNotFound()
	}
	l, err := a.bitlyLink(c, host, code)
	if err != nil {
		return err
	}
	writeJSON(c.w, http.StatusOK, map[string]string{"link": l.GetShortUrl(), "id": bitlinkID(l),
		"long_url": l.GetLongUrl(), "created_at": l.GetCreateTime().AsTime().UTC().Format(bitlyDate)})
	return nil
}

// bitlyUser is GET /v4/user, charged as its own route: the tenant as a
// Bitly user, its tenant the default (and only) group.
func (a *API) bitlyUser(c *call) error {
	ctx, cancel := a.downstream(c)
	defer cancel()
	t, err := a.keys.Tenant(ctx, c.tenant())
	if err != nil {
		return unavailable("the tenant could not be read; try again", err)
	}
	created := t.Created.UTC().Format(bitlyDate)
	writeJSON(c.w, http.StatusOK, map[string]any{"login": t.ID, "name": t.Name, "is_active": true,
		"created": created, "modified": created, "is_sso_user": false, "emails": []string{}, "is_2fa_enabled": false,
		"default_group_guid": t.ID})
	return nil
}

// bitlyGroupOf is the tenant id (named name, made at created) as a Bitly
// group, its own organization.
func bitlyGroupOf(id, name string, created time.Time) map[string]any {
	at := created.UTC().Format(bitlyDate)
	return map[string]any{"guid": id, "organization_guid": id, "name": name, "is_active": true, "role": "org-admin",
		"bsds": []string{}, "created": at, "modified": at,
		"references": map[string]string{"organization": bitlyPrefix + "organizations/" + url.PathEscape(id)}}
}

// bitlyGroups is GET /v4/groups and GET /v4/groups/{group_guid}, charged
// as their own routes: the tenant's one group.
func (a *API) bitlyGroups(c *call) error {
	guid := c.r.PathValue("group_guid")
	if err := bitlyGroup(c, guid); err != nil {
		return err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	t, err := a.keys.Tenant(ctx, c.tenant())
	if err != nil {
		return unavailable("the tenant could not be read; try again", err)
	}
	g := bitlyGroupOf(t.ID, t.Name, t.Created)
	if guid != "" {
		writeJSON(c.w, http.StatusOK, g)
		return nil
	}
	writeJSON(c.w, http.StatusOK, map[string]any{"groups": []any{g}})
	return nil
}

// bitlyGroupLinks is GET /v4/groups/{group_guid}/bitlinks, charged as GET
// /v1/links: one ListLinks page of size links (50 by default, at most
// 1,000), newest first, from search_after (a page token; pagination.next
// holds the next page's; page, a page number, only 1); one tag at most
// (tags); archived on is an empty
// page (kurz archives nothing). Bitly's other filters are refused by name
// rather than ignored, which would have the page believed filtered.
func (a *API) bitlyGroupLinks(c *call) error {
	if err := bitlyGroup(c, c.r.PathValue("group_guid")); err != nil {
		return err
	}
	q, err := shlinkQuery(c, "size", "search_after", "page", "archived", "query", "created_before", "created_after", "modified_after",
		"campaign_guid", "channel_guid", "custom_bitlink", "keyword", "encoding_login", "domain_deeplinks", "deeplinks", "launchpad_ids")
	if err != nil {
		return err
	}
	size, err := shlinkCount(q, "size", bitlyDefaultSize, 1, bitlyMaxSize)
	if err != nil {
		return err
	}
	// A page number past the first is refused, not ignored: the first
	// page would be answered for every page a client asks for by number.
	if p := q.Get("page"); p != "" && p != "1" {
		return badParameter("page", "kurz pages by search_after, not by page number: ask for page 1 (or leave page out), then follow pagination.next, or send its pagination.search_after as search_after")
	}
	token := q.Get("search_after")
	if len(token) > bitlyMaxToken {
		return badParameter("search_after", fmt.Sprintf("search_after is longer than %d bytes: send pagination.search_after of the page before as it is", bitlyMaxToken))
	}
	tag, err := bitlyListTag(q)
	if err != nil {
		return err
	}
	archived := q.Get("archived")
	switch archived {
	case "", "off", "both", "on":
	default:
		return badParameter("archived", `archived must be "on", "off" or "both"`)
	}
	for _, name := range []string{"query", "created_before", "created_after", "modified_after", "campaign_guid", "channel_guid", "keyword", "encoding_login", "launchpad_ids"} {
		if q.Get(name) != "" {
			return badParameter(name, fmt.Sprintf("kurz cannot filter links by %s: leave it out (tags filters by one tag)", name))
		}
	}
	for _, name := range []string{"custom_bitlink", "domain_deeplinks", "deeplinks"} {
		if v := q.Get(name); v != "" && v != "off" && v != "both" {
			return badParameter(name, fmt.Sprintf("kurz links have no %s: leave %s out, or send off", strings.ReplaceAll(name, "_", " "), name))
		}
	}
	out := struct {
		Links      []bitlink      `json:"links"`
		Pagination map[string]any `json:"pagination"`
	}{Links: []bitlink{}}
	next := ""
	if archived != "on" {
		ctx, cancel := a.downstream(c)
		defer cancel()
		resp, err := a.shortener.ListLinks(ctx, &shortenerv1.ListLinksRequest{PageSize: int32(size), PageToken: token, Tag: tag})
		if err != nil {
			return err
		}
		for _, l := range resp.GetLinks() {
			out.Links = append(out.Links, bitlinkOf(l, c.tenant()))
		}
		next = resp.GetNextPageToken()
	}
	nextURL := ""
	if next != "" {
		v := url.Values{"size": {fmt.Sprint(size)}, "search_after": {next}}
		if tag != "" {
			v.Set("tags", tag)
		}
		nextURL = bitlyPrefix + "groups/" + url.PathEscape(c.tenant()) + "/bitlinks?" + v.Encode()
	}
	out.Pagination = map[string]any{"prev": "", "next": nextURL, "size": size, "search_after": next}
	writeJSON(c.w, http.StatusOK, out)
	return nil
}

// bitlyListTag is the one tag a list asks for (tags, given once or more
// with the same tag); kurz lists by one tag at a time.
func bitlyListTag(q url.Values) (string, error) {
	var tags []string
	for _, t := range q["tags"] {
		if !isText(t) {
			return "", badParameter("tags", "tags must be UTF-8 text without control characters")
		}
		if t = strings.ToLower(strings.TrimSpace(t)); t != "" && !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	if len(tags) > 1 {
		return "", badParameter("tags", "kurz lists links by one tag at a time: send one tags")
	}
	if len(tags) == 0 {
		return "", nil
	}
	return tags[0], nil
}

// bitlyUnit is one of Bitly's units of time, as kurz can count clicks by
// it: analytics' interval to ask for, the most units one call covers
// (within analytics' 31 days of an hourly series and 400 days of a
// range), and the start of the unit a time falls in, UTC.
type bitlyUnit struct {
	name     string
	interval analyticsv1.Interval
	max      int
	start    func(t time.Time) time.Time
	back     func(t time.Time, n int) time.Time
}

func dayStart(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// bitlyUnits are the units served. minute is not: analytics counts by
// the hour at the finest.
var bitlyUnits = []bitlyUnit{
	{name: "hour", interval: analyticsv1.Interval_INTERVAL_HOUR, max: 744,
		start: func(t time.Time) time.Time { return t.UTC().Truncate(time.Hour) },
		back:  func(t time.Time, n int) time.Time { return t.Add(-time.Duration(n) * time.Hour) }},
	{name: "day", interval: analyticsv1.Interval_INTERVAL_DAY, max: 400, start: dayStart,
		back: func(t time.Time, n int) time.Time { return t.AddDate(0, 0, -n) }},
	// Weeks start on Monday, as ISO 8601's.
	{name: "week", interval: analyticsv1.Interval_INTERVAL_DAY, max: 57,
		start: func(t time.Time) time.Time {
			d := dayStart(t)
			return d.AddDate(0, 0, -((int(d.Weekday()) + 6) % 7))
		},
		back: func(t time.Time, n int) time.Time { return t.AddDate(0, 0, -7*n) }},
	{name: "month", interval: analyticsv1.Interval_INTERVAL_DAY, max: 13,
		start: func(t time.Time) time.Time {
			y, m, _ := t.UTC().Date()
			return time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
		},
		back: func(t time.Time, n int) time.Time { return t.AddDate(0, -n, 0) }},
}

// bitlyRange is a clicks call's range: units of unit up to ref (units -1:
// from the link's creation, at most unit.max).
type bitlyRange struct {
	unit  bitlyUnit
	units int
	ref   time.Time
}

// bitlyRangeOf reads unit (day by default), units (-1 by default, else 1
// to the unit's most) and unit_reference (an ISO 8601 time, now by
// default; a later one is now).
func bitlyRangeOf(q url.Values) (bitlyRange, error) {
	name := q.Get("unit")
	if name == "" {
		name = "day"
	}
	i := slices.IndexFunc(bitlyUnits, func(u bitlyUnit) bool { return u.name == name })
	if i < 0 {
		if name == "minute" {
			return bitlyRange{}, badParameter("unit", "kurz counts clicks by the hour at the finest: send unit hour, day, week or month")
		}
		return bitlyRange{}, badParameter("unit", "unit must be hour, day, week or month")
	}
	r := bitlyRange{unit: bitlyUnits[i], units: -1, ref: time.Now()}
	if q.Get("units") != "-1" {
		n, err := shlinkCount(q, "units", -1, 1, r.unit.max)
		if err != nil {
			return bitlyRange{}, badParameter("units", fmt.Sprintf("units must be -1 (every unit since the link was made, at most %d) or a whole number from 1 to %d for unit %s", r.unit.max, r.unit.max, name))
		}
		r.units = n
	}
	if s := q.Get("unit_reference"); s != "" {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t, err = time.Parse(bitlyDate, s)
		}
		if err != nil {
			hint := ""
			if strings.Contains(s, " ") {
				hint = " (a '+' in a query string is read as a space: send it as %2B)"
			}
			return bitlyRange{}, badParameter("unit_reference", "unit_reference must be an ISO 8601 time such as 2026-01-02T15:04:05+0000"+hint)
		}
		if t.Before(r.ref) {
			r.ref = t
		}
	}
	return r, nil
}

// starts are the starts of the range's units, newest first, for a link
// made at created.
func (r bitlyRange) starts(created time.Time) []time.Time {
	first := r.unit.start(created)
	var out []time.Time
	for s := r.unit.start(r.ref); len(out) < r.unit.max; s = r.unit.back(s, 1) {
		if r.units > 0 && len(out) == r.units || r.units < 0 && len(out) > 0 && s.Before(first) {
			break
		}
		out = append(out, s)
	}
	return out
}

// bitlyClicks answers l's clicks over r: per unit, newest first (clicks),
// or their sum (summary). Bitly counts no bots: clicks are kurz's less
// those of known bots (floods included, as Shlink's nonBots).
func (a *API) bitlyClicks(c *call, l *shortenerv1.Link, r bitlyRange, summary bool) error {
	if a.analytics == nil {
		return unavailable("click statistics are not available", errors.New("no analytics client"))
	}
	starts := r.starts(l.GetCreateTime().AsTime())
	start, end := starts[len(starts)-1], r.ref
	if !end.After(start) {
		end = start.Add(time.Second)
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	st, err := a.analytics.GetLinkStats(ctx, &analyticsv1.GetLinkStatsRequest{Code: l.GetCode(), Domain: l.GetDomain(),
		StartTime: timestamppb.New(start), EndTime: timestamppb.New(end), Interval: r.unit.interval})
	if err != nil {
		return err
	}
	ref := r.ref.UTC().Format(bitlyDate)
	if summary {
		total := st.GetCounts().GetTotal() - st.GetCounts().GetBot()
		writeJSON(c.w, http.StatusOK, map[string]any{"total_clicks": total, "units": r.units, "unit": r.unit.name, "unit_reference": ref})
		return nil
	}
	sums := make(map[time.Time]int64, len(starts))
	for _, b := range st.GetSeries() {
		sums[r.unit.start(b.GetStartTime().AsTime())] += b.GetCounts().GetTotal() - b.GetCounts().GetBot()
	}
	type linkClicks struct {
		Clicks int64  `json:"clicks"`
		Date   string `json:"date"`
	}
	out := make([]linkClicks, 0, len(starts))
	for _, s := range starts {
		out = append(out, linkClicks{Clicks: sums[s], Date: s.Format(bitlyDate)})
	}
	writeJSON(c.w, http.StatusOK, map[string]any{"link_clicks": out, "units": r.units, "unit": r.unit.name, "unit_reference": ref})
	return nil
}
