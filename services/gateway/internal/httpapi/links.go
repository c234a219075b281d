package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkcode"
)

// table is every API route. The OpenAPI document (openapi.json) describes
// exactly these; TestOpenAPIMatchesRoutes keeps the two equal.
func (a *API) table() []route {
	return []route{
		{pattern: "GET /v1/openapi.json", access: public, handle: a.openAPI},

		{pattern: "POST /v1/links", access: tenantOrAnonymous, handle: a.createLink},
		{pattern: "GET /v1/links", access: tenantKey, query: []string{"page_size", "page_token", "tag"}, handle: a.listLinks},
		{pattern: "POST /v1/links:batch", access: tenantKey, handle: a.batchCreateLinks},
		{pattern: "GET /v1/links:export", access: tenantKey, query: []string{"tag"}, handle: a.exportLinks},
		{pattern: "POST /v1/links:import", access: tenantKey, handle: a.importLinks},
		{pattern: "GET /v1/links/{code}", access: tenantKey, handle: a.getLink},
		{pattern: "PATCH /v1/links/{code}", access: tenantKey, handle: a.updateLink},
		{pattern: "DELETE /v1/links/{code}", access: tenantKey, handle: a.deleteLink},
		{pattern: "GET /v1/links/{code}/stats", access: tenantKey, query: []string{"start_time", "end_time", "interval"}, handle: a.linkStats},
		{pattern: "GET /v1/links/{code}/qr", access: tenantKey, query: []string{"format", "size"}, handle: a.linkQR},
		{pattern: "POST /links", access: tenantOrAnonymous, handle: a.createLinkCompat},

		{pattern: "POST /v1/admin/tenants", access: adminToken, handle: a.createTenant},
		{pattern: "GET /v1/admin/tenants/{tenant}", access: adminToken, handle: a.getTenant},
		{pattern: "PATCH /v1/admin/tenants/{tenant}", access: adminToken, handle: a.updateTenant},
		{pattern: "POST /v1/admin/tenants/{tenant}/keys", access: adminToken, handle: a.issueKey},
		{pattern: "GET /v1/admin/tenants/{tenant}/keys", access: adminToken, handle: a.listKeys},
		{pattern: "DELETE /v1/admin/tenants/{tenant}/keys/{key}", access: adminToken, handle: a.revokeKey},
	}
}

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

func (a *API) createLink(c *call) error {
	b, err := a.readBody(c, false)
	if err != nil {
		return err
	}
	var req shortenerv1.CreateLinkRequest
	if err := decodeProto(b, &req); err != nil {
		return err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.shortener.CreateLink(ctx, &req)
	if err != nil {
		return err
	}
	c.w.Header().Set("Location", "/v1/links/"+resp.GetLink().GetCode())
	return writeProto(c.w, http.StatusCreated, resp.GetLink())
}

func (a *API) listLinks(c *call) error {
	q := c.r.URL.Query()
	req := &shortenerv1.ListLinksRequest{PageToken: q.Get("page_token"), Tag: q.Get("tag")}
	if s := q.Get("page_size"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			return badRequest("page_size must be a whole number from 1 to 1000")
		}
		req.PageSize = int32(n)
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.shortener.ListLinks(ctx, req)
	if err != nil {
		return err
	}
	if resp.Links == nil {
		resp.Links = []*shortenerv1.Link{} // "links": [] rather than nothing
	}
	return writeProto(c.w, http.StatusOK, resp)
}

func (a *API) getLink(c *call) error {
	code, err := pathCode(c)
	if err != nil {
		return err
	}
	link, err := a.fetchLink(c, code)
	if err != nil {
		return err
	}
	return writeProto(c.w, http.StatusOK, link)
}

// fetchLink returns one of the caller's links; other tenants' links are
// NOT_FOUND, which is what keeps stats and QR codes tenant-scoped.
func (a *API) fetchLink(c *call, code string) (*shortenerv1.Link, error) {
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.shortener.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code})
	if err != nil {
		return nil, err
	}
	return resp.GetLink(), nil
}

// mutableLinkFields are the Link fields PATCH may change.
var mutableLinkFields = []protoreflect.Name{
	"long_url", "redirect_type", "expire_time", "disabled", "tags", "max_visits", "password", "device_targets",
	"rules", "variants",
}

// mutableLinkJSON lists mutableLinkFields by their JSON names, for messages.
const mutableLinkJSON = "longUrl, redirectType, expireTime, disabled, tags, maxVisits, password, deviceTargets, rules and variants"

// updateLink changes the fields present in the body (a partial Link in proto
// JSON); "expireTime": null clears the expiry, "tags": [] the tags,
// "maxVisits": 0 the visit limit, "password": "" the password and
// "deviceTargets": null the device targets, "rules": [] (or null) the rules
// and "variants": [] the variants.
func (a *API) updateLink(c *call) error {
	code, err := pathCode(c)
	if err != nil {
		return err
	}
	b, err := a.readBody(c, false)
	if err != nil {
		return err
	}
	link := &shortenerv1.Link{}
	if err := decodeProto(b, link); err != nil {
		return err
	}
	var present map[string]json.RawMessage
	if err := json.Unmarshal(b, &present); err != nil {
		return badRequest("invalid JSON body: the body must be a JSON object")
	}
	fields := link.ProtoReflect().Descriptor().Fields()
	var mask []string
	for key := range present {
		fd := fields.ByJSONName(key)
		if fd == nil {
			fd = fields.ByTextName(key)
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
	link.Code = code
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.shortener.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: link, UpdateMask: &fieldmaskpb.FieldMask{Paths: mask}})
	if err != nil {
		return err
	}
	return writeProto(c.w, http.StatusOK, resp.GetLink())
}

func (a *API) deleteLink(c *call) error {
	code, err := pathCode(c)
	if err != nil {
		return err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	if _, err := a.shortener.DeleteLink(ctx, &shortenerv1.DeleteLinkRequest{Code: code}); err != nil {
		return err
	}
	c.w.WriteHeader(http.StatusNoContent)
	return nil
}

// linkStats answers from the analytics service, after the shortener has
// confirmed the link is the caller's: analytics knows codes, not tenants.
func (a *API) linkStats(c *call) error {
	code, err := pathCode(c)
	if err != nil {
		return err
	}
	q := c.r.URL.Query()
	req := &analyticsv1.GetLinkStatsRequest{Code: code}
	for _, p := range []struct {
		name string
		dst  **timestamppb.Timestamp
	}{{"start_time", &req.StartTime}, {"end_time", &req.EndTime}} {
		if s := q.Get(p.name); s != "" {
			t, err := time.Parse(time.RFC3339, s)
			if err != nil {
				return badRequest(fmt.Sprintf("%s must be an RFC 3339 time such as 2026-01-02T15:04:05Z", p.name))
			}
			*p.dst = timestamppb.New(t)
		}
	}
	switch q.Get("interval") {
	case "":
	case "hour":
		req.Interval = analyticsv1.Interval_INTERVAL_HOUR
	case "day":
		req.Interval = analyticsv1.Interval_INTERVAL_DAY
	default:
		return badRequest(`interval must be "hour" or "day"`)
	}
	if _, err := a.fetchLink(c, code); err != nil {
		return err
	}
	ctx, cancel := a.downstream(c)
	defer cancel()
	resp, err := a.analytics.GetLinkStats(ctx, req)
	if err != nil {
		return err
	}
	return writeProto(c.w, http.StatusOK, resp)
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
