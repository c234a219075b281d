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

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkcode"
)

// table is every API route. The OpenAPI document (openapi.json) describes
// exactly these; TestOpenAPIDocumentsEveryRoute keeps the two equal. A
// route with rpc is an RPC the protos map to HTTP (google.api.http), served
// through the generated handler (mapped.go): adding one takes its
// annotation and its line here.
func (a *API) table() []route {
	return []route{
		{pattern: "GET /v1/openapi.json", access: public, handle: a.openAPI},

		{pattern: "POST /v1/links", access: tenantOrAnonymous, rpc: &mapping{status: http.StatusCreated, existed: linkExisted, location: linkLocation, idempotent: true, etag: linkETag}},
		{pattern: "GET /v1/links", access: tenantKey, query: []string{"page_size", "page_token", "tag"}, rpc: &mapping{before: checkPageSize}},
		{pattern: "POST /v1/links:batch", access: tenantKey, rpc: &mapping{bulkBody: batchBodyBytes, before: checkBatchItems}},
		{pattern: exportRoute, access: tenantKey, query: []string{"tag"}, handle: a.exportLinks},
		{pattern: importRoute, access: tenantKey, handle: a.importLinks},
		{pattern: "GET /v1/links/{code}", access: tenantKey, query: []string{"domain"}, rpc: &mapping{before: checkDomain, etag: linkETag}},
		{pattern: "PATCH /v1/links/{code}", access: tenantKey, rpc: &mapping{before: patchMask, etag: linkETag, conditional: true}},
		{pattern: "DELETE /v1/links/{code}", access: tenantKey, query: []string{"domain"}, rpc: &mapping{before: checkDomain, status: http.StatusNoContent, conditional: true}},
		{pattern: statsRoute, access: tenantKey, query: []string{"start_time", "end_time", "interval", "domain"}, rpc: &mapping{before: a.statsFirst}},
		{pattern: "POST /v1/links:clickCounts", access: tenantKey, charge: statsRoute, rpc: &mapping{body: clickCountsBodyBytes, before: a.clickCountsFirst}},
		{pattern: "GET /v1/links/{code}/qr", access: tenantKey, query: []string{"format", "size", "domain"}, handle: a.linkQR},
		{pattern: "POST /links", access: tenantOrAnonymous, handle: a.createLinkCompat},
		{pattern: "POST /yourls-api.php", access: ownKey, charge: yourlsRoute, ownQuery: true, handle: a.yourlsAPI},
		{pattern: "POST /yourls-api", access: ownKey, charge: yourlsRoute, ownQuery: true, handle: a.yourlsAPI},
		{pattern: "GET /rest/health", access: public, ownQuery: true, shlink: true, handle: a.shlinkHealth},
		{pattern: "GET /rest/{version}/health", access: public, ownQuery: true, shlink: true, handle: shlinkVersioned(a.shlinkHealth)},
		{pattern: "POST /rest/{version}/short-urls", access: shlinkKey, charge: "POST /v1/links", ownQuery: true, shlink: true, handle: shlinkVersioned(a.shlinkCreate)},
		{pattern: "GET /rest/{version}/short-urls", access: shlinkKey, charge: "GET /v1/links", ownQuery: true, shlink: true, handle: shlinkVersioned(a.shlinkList)},
		{pattern: "GET /rest/{version}/short-urls/{shortCode}", access: shlinkKey, charge: "GET /v1/links/{code}", ownQuery: true, shlink: true, handle: shlinkVersioned(a.shlinkGet)},
		{pattern: "PATCH /rest/{version}/short-urls/{shortCode}", access: shlinkKey, charge: "PATCH /v1/links/{code}", ownQuery: true, shlink: true, handle: shlinkVersioned(a.shlinkEdit)},
		{pattern: "DELETE /rest/{version}/short-urls/{shortCode}", access: shlinkKey, charge: "DELETE /v1/links/{code}", ownQuery: true, shlink: true, handle: shlinkVersioned(a.shlinkDelete)},
		{pattern: "GET /rest/{version}/short-urls/{shortCode}/visits", access: shlinkKey, charge: statsRoute, ownQuery: true, shlink: true, handle: shlinkVersioned(a.shlinkVisitsList)},
		{pattern: "GET /rest/{version}/domains", access: shlinkKey, charge: "GET /v1/domains", ownQuery: true, shlink: true, handle: shlinkVersioned(a.shlinkDomains)},
		{pattern: "POST /v4/shorten", access: tenantKey, charge: "POST /v1/links", ownQuery: true, bitly: true, handle: a.bitlyShorten},
		{pattern: "POST /v4/bitlinks", access: tenantKey, charge: "POST /v1/links", ownQuery: true, bitly: true, handle: a.bitlyShorten},
		{pattern: "GET /v4/bitlinks/{domain}/{hash...}", access: tenantKey, chargeOf: bitlinkCharge, ownQuery: true, bitly: true, handle: a.bitlinkGet},
		{pattern: "PATCH /v4/bitlinks/{domain}/{hash...}", access: tenantKey, charge: "PATCH /v1/links/{code}", ownQuery: true, bitly: true, handle: a.bitlinkEdit},
		{pattern: "DELETE /v4/bitlinks/{domain}/{hash...}", access: tenantKey, charge: "DELETE /v1/links/{code}", ownQuery: true, bitly: true, handle: a.bitlinkDelete},
		{pattern: "POST /v4/expand", access: tenantKey, charge: "GET /v1/links/{code}", ownQuery: true, bitly: true, handle: a.bitlyExpand},
		{pattern: "GET /v4/user", access: tenantKey, ownQuery: true, bitly: true, handle: a.bitlyUser},
		{pattern: "GET /v4/groups", access: tenantKey, ownQuery: true, bitly: true, handle: a.bitlyGroups},
		{pattern: "GET /v4/groups/{group_guid}", access: tenantKey, ownQuery: true, bitly: true, handle: a.bitlyGroups},
		{pattern: "GET /v4/groups/{group_guid}/bitlinks", access: tenantKey, charge: "GET /v1/links", ownQuery: true, bitly: true, handle: a.bitlyGroupLinks},

		{pattern: "POST /v1/webhooks", access: tenantKey, rpc: &mapping{status: http.StatusCreated, existed: webhookExisted, location: webhookLocation, idempotent: true}},
		{pattern: "GET /v1/webhooks", access: tenantKey, rpc: &mapping{}},
		{pattern: "DELETE /v1/webhooks/{id}", access: tenantKey, rpc: &mapping{status: http.StatusNoContent}},
		{pattern: "GET /v1/webhooks/{webhookId}/deliveries", access: tenantKey, query: []string{"page_size", "page_token", "status"}, rpc: &mapping{before: checkDeliveriesPage}},
		{pattern: "POST /v1/webhooks/{webhookId}/deliveries/{id}/redeliver", access: tenantKey, rpc: &mapping{noBody: true}},

		{pattern: "POST /v1/domains", access: tenantKey, rpc: &mapping{status: http.StatusCreated, existed: domainExisted, location: domainLocation}},
		{pattern: "GET /v1/domains", access: tenantKey, rpc: &mapping{}},
		{pattern: "GET /v1/domains/{name}", access: tenantKey, rpc: &mapping{}},
		{pattern: "DELETE /v1/domains/{name}", access: tenantKey, rpc: &mapping{status: http.StatusNoContent}},
		{pattern: "POST /v1/domains/{name}/verify", access: tenantKey, rpc: &mapping{noBody: true}},

		{pattern: "POST /v1/admin/tenants", access: adminToken, handle: a.createTenant},
		{pattern: "GET /v1/admin/tenants", access: adminToken, query: []string{"page_size", "page_token", "state", "plan"}, handle: a.listTenants},
		{pattern: "GET /v1/admin/tenants/{tenant}", access: adminToken, handle: a.getTenant},
		{pattern: "PATCH /v1/admin/tenants/{tenant}", access: adminToken, handle: a.updateTenant},
		{pattern: "POST /v1/admin/tenants/{tenant}/suspend", access: adminToken, handle: a.suspendTenant},
		{pattern: "POST /v1/admin/tenants/{tenant}/resume", access: adminToken, handle: a.resumeTenant},
		{pattern: "POST /v1/admin/tenants/{tenant}/keys", access: adminToken, handle: a.issueKey},
		{pattern: "GET /v1/admin/tenants/{tenant}/keys", access: adminToken, handle: a.listKeys},
		{pattern: "DELETE /v1/admin/tenants/{tenant}/keys/{key}", access: adminToken, handle: a.revokeKey},
		{pattern: "DELETE /v1/admin/tenants/{tenant}/domains/{name}", access: adminToken, handle: a.releaseDomain},
		{pattern: "DELETE /v1/admin/tenants/{tenant}/links/{code}", access: adminToken, query: []string{"domain"}, handle: a.deleteTenantLink},
		{pattern: "POST /v1/admin/tenants/{tenant}/domains/{name}/verify", access: adminToken, handle: a.approveDomain},
		{pattern: "GET /v1/admin/rules", access: adminToken, handle: a.getRules},
		{pattern: "PUT /v1/admin/rules", access: adminToken, query: []string{"dry_run", "prune", "merge_domains"}, handle: a.applyRules, conditional: true},
	}
}

// statsRoute is the pattern of a link's statistics: what the calls of the
// compatible APIs that ask analytics for a link's clicks are charged as.
const statsRoute = "GET /v1/links/{code}/stats"

// pathCode returns the {code} of the path, refusing anything that cannot be
// a code before a service sees it.
func pathCode(c *call) (string, error) {
	code := c.r.PathValue("code")
	if !linkcode.Plausible(code) {
		return "", badRequest(fmt.Sprintf("the code in the path is not a short code: %d to %d letters, digits, '-' or '_'",
			linkcode.MinLength, linkcode.MaxLength))
	}
	return code, nil
}

// linkLocation is the Location of a created link: its code, and its
// custom domain as ?domain=.
func linkLocation(resp proto.Message) string {
	l := resp.(*shortenerv1.CreateLinkResponse).GetLink()
	loc := "/v1/links/" + l.GetCode()
	if d := l.GetDomain(); d != "" {
		loc += "?domain=" + url.QueryEscape(d)
	}
	return loc
}

// linkExisted reports a create that returned the tenant's existing link of
// the URL (CODE_MODE_FROM_URL): 200, not 201.
func linkExisted(resp proto.Message) bool {
	return !resp.(*shortenerv1.CreateLinkResponse).GetCreated()
}

// checkPageSize refuses a page_size out of 1 to 1000. An empty one
// (?page_size=) is refused too, with the same message: grpc-gateway would
// refuse it with its parser's text, and a client that sends an empty size
// most likely meant one it failed to fill in.
func checkPageSize(_ *call, _ []byte, q url.Values) error {
	if q.Has("page_size") {
		if n, err := strconv.Atoi(q.Get("page_size")); err != nil || n < 1 || n > 1000 {
			return badRequest("page_size must be a whole number from 1 to 1000")
		}
	}
	return nil
}

// fetchLink returns one of the caller's links, on the domain of the
// request's ?domain= (the default domain without); other tenants' links
// are NOT_FOUND, which is what keeps stats and QR codes tenant-scoped.
func (a *API) fetchLink(c *call, code string) (*shortenerv1.Link, error) {
	domain, err := queryDomain(c)
	if err != nil {
		return nil, err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.shortener.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code, Domain: domain})
	if err != nil {
		return nil, err
	}
	return resp.GetLink(), nil
}

// lifetimeStatsRange is the longest range analytics answers (400 days),
// less an hour for its rounding: a link's lifetime counts (YOURLS's
// url-stats, Shlink's visitsSummary) are the clicks of its life up to it.
const lifetimeStatsRange = 400*24*time.Hour - time.Hour

// lifetimeStart is where the lifetime counts of links made at created
// (the oldest of them) start at now: then, but at most lifetimeStatsRange
// before now, and an hour before now for a link stamped ahead of this
// gateway's clock (the shortener's host runs ahead), as analytics refuses
// a range that ends before it starts. Codes are never reused, so a link
// has no clicks from before it was made.
func lifetimeStart(created, now time.Time) time.Time {
	start := created
	if oldest := now.Add(-lifetimeStatsRange); start.Before(oldest) {
		start = oldest
	}
	if !start.Before(now) {
		start = now.Add(-time.Hour)
	}
	return start
}

// lifetimeCounts are the clicks of l since it was made, over the last 400
// days at most (the longest range analytics answers): one statistics call.
func (a *API) lifetimeCounts(c *call, l *shortenerv1.Link) (*analyticsv1.ClickCounts, error) {
	if a.analytics == nil {
		return nil, unavailable("click statistics are not available", errors.New("no analytics client"))
	}
	now := time.Now()
	start := lifetimeStart(l.GetCreateTime().AsTime(), now)
	ctx, cancel := a.downstream(c)
	defer cancel()
	st, err := a.analytics.GetLinkStats(ctx, &analyticsv1.GetLinkStatsRequest{
		Code: l.GetCode(), Domain: l.GetDomain(), StartTime: timestamppb.New(start), EndTime: timestamppb.New(now),
	})
	if err != nil {
		return nil, err
	}
	return st.GetCounts(), nil
}

// mutableLinkFields are the Link fields PATCH may change.
var mutableLinkFields = []protoreflect.Name{
	"long_url", "redirect_type", "expire_time", "disabled", "tags", "title", "max_visits", "password", "device_targets",
	"rules", "variants",
}

// mutableLinkJSON lists mutableLinkFields by their JSON names, for messages.
const mutableLinkJSON = "longUrl, redirectType, expireTime, disabled, tags, title, maxVisits, password, deviceTargets, rules and variants"

// patchMask makes PATCH change the fields present in the body (a partial
// Link in proto JSON) and only those: the update mask is the body's
// top-level fields, sorted, handed to UpdateLink's mapping as its
// update_mask query parameter (grpc-gateway's own mask from the body would
// name nested fields, deviceTargets.iosUrl, where PATCH replaces the
// whole deviceTargets). "expireTime": null clears the expiry, "tags": []
// the tags, "title": "" (or null) the title, "maxVisits": 0 the visit limit, "password": "" the password,
// "deviceTargets": null the device targets, "rules": [] (or null) the rules
// and "variants": [] (or null) the variants. "domain" names the link's
// custom domain (it identifies the link, and is not changed).
func patchMask(_ *call, body []byte, q url.Values) error {
	if err := decodeProto(body, &shortenerv1.Link{}); err != nil {
		return err
	}
	var present map[string]json.RawMessage
	if err := json.Unmarshal(body, &present); err != nil {
		return badRequest("invalid JSON body: the body must be a JSON object")
	}
	fields := (&shortenerv1.Link{}).ProtoReflect().Descriptor().Fields()
	var mask []string
	for key := range present {
		fd := fields.ByJSONName(key)
		if fd == nil {
			fd = fields.ByTextName(key)
		}
		if fd != nil && (fd.Name() == "domain" || fd.Name() == "etag") {
			continue // identifies the link, or the state a change applies to
		}
		if fd == nil || !slices.Contains(mutableLinkFields, fd.Name()) {
			return badRequest(fmt.Sprintf("field %q cannot be changed; PATCH takes %s", key, mutableLinkJSON))
		}
		mask = append(mask, string(fd.Name()))
	}
	if len(mask) == 0 {
		return badRequest("nothing to change: send one or more of " + mutableLinkJSON)
	}
	slices.Sort(mask)
	q.Set("update_mask", strings.Join(mask, ","))
	return nil
}

// statsFirst checks a stats request before analytics is asked: the times
// are RFC 3339, the interval hour or day (or the enum's names), and the
// link is the caller's (the shortener confirms it): analytics knows codes,
// not tenants.
func (a *API) statsFirst(c *call, _ []byte, q url.Values) error {
	for _, name := range []string{"start_time", "end_time"} {
		if s := q.Get(name); s != "" {
			if _, err := time.Parse(time.RFC3339, s); err != nil {
				// A '+' sent as is in a query string is a space: the
				// offset of 2026-01-02T15:04:05+02:00 arrives as " 02:00".
				hint := ""
				if strings.Contains(s, " ") {
					hint = " (a '+' in a query string is read as a space: send an offset's '+' as %2B, e.g. 2026-01-02T15:04:05%2B02:00)"
				}
				return badRequest(fmt.Sprintf("%s must be an RFC 3339 time such as 2026-01-02T15:04:05Z%s", name, hint))
			}
		}
	}
	switch iv := q.Get("interval"); iv {
	case "":
	case "hour", "day":
		q.Set("interval", "INTERVAL_"+strings.ToUpper(iv))
	case analyticsv1.Interval_INTERVAL_HOUR.String(), analyticsv1.Interval_INTERVAL_DAY.String():
	default:
		return badRequest(`interval must be "hour" or "day"`)
	}
	code, err := pathCode(c)
	if err != nil {
		return err
	}
	link, err := a.fetchLink(c, code)
	if err != nil {
		return err
	}
	// The domain as the shortener normalised it.
	if d := link.GetDomain(); d != "" {
		q.Set("domain", d)
	} else {
		q.Del("domain")
	}
	return nil
}

// maxClickCountsLinks is the most links one POST /v1/links:clickCounts
// names: analytics' bound, the largest page of GET /v1/links.
const maxClickCountsLinks = 1000

// clickCountsBodyBytes bounds the body of POST /v1/links:clickCounts (when
// larger than Options.MaxBodyBytes): maxClickCountsLinks references of up
// to 400 bytes of JSON each ({"code": 32 characters, "domain": 253, and
// room for spacing), so that a full page of links on long custom domains
// fits in one call, as the route promises. It takes no bulk slot: the body
// is a list of names, decoded into a few hundred kilobytes at most, and
// the call is charged before it is read; it is paced as a bulk body is
// (serveMapped), so that trickled bodies are not held for ReadTimeout.
const clickCountsBodyBytes = maxClickCountsLinks * 400

// countsPerCharge is how many links' click counts one charge of statsRoute
// buys (POST /v1/links:clickCounts, a Shlink list's visitsSummary): a
// link's counts are a smaller read than its stats (one table, no series
// or breakdowns), but charged once per call, 1,000 links over 400 days
// were one unit, a read of up to 1,000 links' hourly rows (the 256 MiB
// cap) where GET /v1/links/{code}/stats reads one link's: a free key's 60
// a minute loaded ClickHouse a thousandfold its stats allowance. A page
// of the console (20 links) or of a Shlink client (10) is one charge
// still, a page of 1,000 ten.
const countsPerCharge = 100

// countsCharges is the charges of statsRoute for n links' click counts.
func countsCharges(n int) uint32 {
	return uint32(max(1, (n+countsPerCharge-1)/countsPerCharge))
}

// clickCountsFirst checks a POST /v1/links:clickCounts before its body is
// decoded: no more than maxClickCountsLinks links (counted without
// decoding them, as a batch's items are; none is requestChecks' refusal),
// and analytics there to ask. The links need no check with the shortener,
// unlike statsFirst's: analytics answers zeros for a link that is not the
// caller's, as for one without clicks, so nothing of another tenant shows.
// Admission charged statsRoute once; the links past the first
// countsPerCharge are charged here (countsCharges), before analytics is
// asked.
func (a *API) clickCountsFirst(c *call, body []byte, _ url.Values) error {
	n := countItems(body, "links", maxClickCountsLinks)
	if n > maxClickCountsLinks {
		return badRequest(fmt.Sprintf(`"links" must name 1 to %d links; it names more than %d: split the list`, maxClickCountsLinks, maxClickCountsLinks))
	}
	if a.analytics == nil {
		return unavailable("click statistics are not available", errors.New("no analytics client"))
	}
	if more := countsCharges(n) - 1; more > 0 {
		if err := a.edgeQuotaCost(c, statsRoute, more); err != nil {
			var e *apiError
			if errors.As(err, &e) && e.status == http.StatusBadRequest {
				// More than the key's rule ever holds at once.
				return badRequest(fmt.Sprintf(`"links" names %d links, charged as %d requests of %s (one per %d links), more than this key's rate limit ever allows at once: name fewer links a call`,
					n, more+1, statsRoute, countsPerCharge))
			}
			return err
		}
	}
	return nil
}

// compatRequest is the notes' prototype body.
type compatRequest struct {
	LongURL string `json:"longUrl"`
	Mode    string `json:"mode"`
}

// compatResponse is the prototype's answer: {"code": ..., "short": ...}.
type compatResponse struct {
	Code  string `json:"code"`
	Short string `json:"short"`
}

// createLinkCompat is the prototype's POST /links: mode "random" or
// sequential by default; an invalid URL answers {"error": "invalid url"}
// with 400, as the prototype did. Other errors use the uniform body.
func (a *API) createLinkCompat(c *call) error {
	b, err := a.readBody(c, false)
	if err != nil {
		return err
	}
	var body compatRequest
	if err := decodeJSON(b, &body); err != nil {
		return err
	}
	req := &shortenerv1.CreateLinkRequest{LongUrl: body.LongURL}
	switch body.Mode {
	case "", "sequential":
		req.Mode = shortenerv1.CodeMode_CODE_MODE_SEQUENTIAL
	case "random":
		req.Mode = shortenerv1.CodeMode_CODE_MODE_RANDOM
	default:
		return badRequest(`mode must be "random", "sequential" or left out`)
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.shortener.CreateLink(ctx, req)
	if err != nil {
		if invalidURL(err) {
			writeJSON(c.w, http.StatusBadRequest, map[string]string{"error": "invalid url"})
			return nil
		}
		return err
	}
	writeJSON(c.w, http.StatusCreated, compatResponse{Code: resp.GetLink().GetCode(), Short: resp.GetLink().GetShortUrl()})
	return nil
}

// invalidURL reports whether the shortener refused the long URL itself.
func invalidURL(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.InvalidArgument {
		return false
	}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if strings.HasPrefix(d.GetReason(), "URL_") || d.GetMetadata()["field"] == "long_url" {
				return true
			}
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				if v.GetField() == "long_url" {
					return true
				}
			}
		}
	}
	return false
}
