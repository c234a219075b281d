package httpapi

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/services/gateway/internal/keystore"
)

// Tenant is the tenant of shlinkGoodKey, for the Bitly API's user and
// groups.
func (shlinkKeys) Tenant(_ context.Context, id string) (keystore.Tenant, error) {
	return keystore.Tenant{ID: id, Name: "Acme Inc.", Plan: "free", Created: shlinkCreated}, nil
}

// bitlyAnalytics answers every GetLinkStats with series and counts,
// recording what it was asked.
type bitlyAnalytics struct {
	analyticsv1.AnalyticsServiceClient
	series []*analyticsv1.TimeBucket
	counts *analyticsv1.ClickCounts
	asked  []*analyticsv1.GetLinkStatsRequest
}

func (s *bitlyAnalytics) GetLinkStats(_ context.Context, in *analyticsv1.GetLinkStatsRequest, _ ...grpc.CallOption) (*analyticsv1.GetLinkStatsResponse, error) {
	s.asked = append(s.asked, proto.Clone(in).(*analyticsv1.GetLinkStatsRequest))
	return &analyticsv1.GetLinkStatsResponse{Code: in.GetCode(), Counts: s.counts, Series: s.series}, nil
}

// bitlyEnv is an API on the Shlink tests' fakes and bitlyAnalytics.
type bitlyEnv struct {
	t         *testing.T
	handler   *shlinkEnv
	analytics *bitlyAnalytics
}

func newBitlyEnv(t *testing.T, links ...*shortenerv1.Link) *bitlyEnv {
	t.Helper()
	env := &shlinkEnv{t: t, limiter: &shlinkLimiter{}, shortener: &shlinkShortener{links: links}}
	an := &bitlyAnalytics{counts: &analyticsv1.ClickCounts{Total: 7, Human: 4, Bot: 2, Flood: 1}}
	env.handler = serveFakes(t, env.limiter, Deps{Shortener: env.shortener, Analytics: an, Log: slog.New(slog.DiscardHandler)})
	return &bitlyEnv{t: t, handler: env, analytics: an}
}

// do sends method target with body and key as the bearer token ("" sends
// none).
func (env *bitlyEnv) do(method, target, body, key string) *httptest.ResponseRecorder {
	env.t.Helper()
	if key == "" {
		return env.handler.do(method, target, body, "")
	}
	return env.handler.do(method, target, body, "", "Authorization", "Bearer "+key)
}

// bitlyErrorOf checks that w is Bitly's error body of status and message,
// and returns it.
func bitlyErrorOf(t *testing.T, w *httptest.ResponseRecorder, status int, message string) map[string]any {
	t.Helper()
	p := object(t, w)
	if _, ok := p["resource"].(string); !ok {
		t.Errorf("%d %s: no resource; Bitly's SDKs tell its errors by message and resource", w.Code, w.Body)
	}
	if w.Code != status || w.Header().Get("Content-Type") != "application/json" || p["message"] != message ||
		p["description"] == "" || p["request_id"] == "" || w.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("got %d %s %s; want Bitly's error %d %s", w.Code, w.Header().Get("Content-Type"), w.Body, status, message)
	}
	return p
}

// A create answers Bitly's bitlink, 201 when the link is new and 200 when
// the caller had shortened the URL already (kurz's CODE_MODE_FROM_URL);
// bit.ly is the default domain; title is taken and not kept.
func TestBitlyCreateAnswersTheBitlink(t *testing.T) {
	env := newBitlyEnv(t)
	w := env.do("POST", "/v4/shorten", `{"long_url":"https://example.com/a","domain":"bit.ly","group_guid":"acme","title":"A"}`, shlinkGoodKey)
	b := object(t, w)
	if w.Code != 201 || b["id"] != "k.test/new0001" || b["link"] != "https://k.test/new0001" || b["long_url"] != "https://example.com/a" ||
		b["created_at"] != "2026-03-01T10:30:00+0000" || b["archived"] != false || b["custom_bitlinks"] == nil ||
		b["references"].(map[string]any)["group"] != "/v4/groups/acme" {
		t.Errorf("new link: %d %s; want 201 and the bitlink", w.Code, w.Body)
	}
	req := env.handler.shortener.creates[0]
	if req.GetMode() != shortenerv1.CodeMode_CODE_MODE_FROM_URL || req.GetDomain() != "" {
		t.Errorf("CreateLink %v; want CODE_MODE_FROM_URL on the default domain", req)
	}

	env.handler.shortener.existing = shlinkLink("abcd123")
	w = env.do("POST", "/v4/bitlinks", `{"long_url":"https://example.com/abcd123","tags":["x"]}`, shlinkGoodKey)
	if b := object(t, w); w.Code != 200 || b["id"] != "k.test/abcd123" {
		t.Errorf("link shortened again: %d %s; want 200 and the existing bitlink", w.Code, w.Body)
	}
}

// Refusals are in Bitly's shape, with the resource called:
// INVALID_ARG_<FIELD> naming the field, 403 FORBIDDEN for a missing key
// or another group, 404 for a call not served, 429 for the edge quota
// with Retry-After and the RateLimit fields.
func TestBitlyRefusalsAreBitlysShape(t *testing.T) {
	env := newBitlyEnv(t)
	// Bitly's resource of a call: a shorten's is "bitlinks"; a call not
	// served has none.
	resources := map[string]string{"/v4/shorten": "bitlinks", "/v4/bitlinks/k.test/nope123": "bitlinks",
		"/v4/groups/other": "groups", "/v4/qr-codes": ""}
	for _, tc := range []struct {
		method, target, body, key string
		status                    int
		message                   string
	}{
		{"POST", "/v4/shorten", `{"domain":"bit.ly"}`, shlinkGoodKey, 400, "INVALID_ARG_LONG_URL"},
		{"POST", "/v4/bitlinks", `{"long_url":"https://example.com/a","deeplinks":[{"app_id":"x"}]}`, shlinkGoodKey, 400, "INVALID_ARG_DEEPLINKS"},
		{"POST", "/v4/shorten", `{"long_url":"https://example.com/a","group_guid":"other"}`, shlinkGoodKey, 403, "FORBIDDEN"},
		{"POST", "/v4/shorten", `{"long_url":"https://example.com/a"}`, "", 403, "FORBIDDEN"},
		{"POST", "/v4/shorten", `{"long_url":"https://example.com/a"}`, "kurz_k9_wrong", 403, "FORBIDDEN"},
		{"POST", "/v4/shorten", `not json`, shlinkGoodKey, 400, "BAD_REQUEST"},
		{"GET", "/v4/groups/other", "", shlinkGoodKey, 403, "FORBIDDEN"},
		{"GET", "/v4/bitlinks/k.test/abcd123/countries", "", shlinkGoodKey, 404, "NOT_FOUND"},
		{"POST", "/v4/qr-codes", `{}`, shlinkGoodKey, 404, "NOT_FOUND"},
		{"GET", "/v4/bitlinks/k.test/nope123", "", shlinkGoodKey, 404, "NOT_FOUND"},
		{"GET", "/v4/bitlinks/abcd123", "", shlinkGoodKey, 404, "NOT_FOUND"},
		{"PUT", "/v4/shorten", `{}`, shlinkGoodKey, 405, "METHOD_NOT_ALLOWED"},
	} {
		w := env.do(tc.method, tc.target, tc.body, tc.key)
		p := bitlyErrorOf(t, w, tc.status, tc.message)
		if want, ok := resources[tc.target]; ok && p["resource"] != want {
			t.Errorf("%s %s: resource %v, want %q", tc.method, tc.target, p["resource"], want)
		}
		if strings.HasPrefix(tc.message, "INVALID_ARG_") {
			field := strings.ToLower(strings.TrimPrefix(tc.message, "INVALID_ARG_"))
			if errs, _ := p["errors"].([]any); len(errs) == 0 || errs[0].(map[string]any)["field"] != field {
				t.Errorf("%s %s: errors %v; want %s named", tc.method, tc.target, p["errors"], field)
			}
		}
	}

	env.handler.limiter.denyAPI = true
	w := env.do("POST", "/v4/shorten", `{"long_url":"https://example.com/a"}`, shlinkGoodKey)
	bitlyErrorOf(t, w, 429, "RATE_LIMIT_EXCEEDED")
	if w.Header().Get("Retry-After") != "3" || len(w.Header()["RateLimit-Policy"]) != 1 {
		t.Errorf("denied: Retry-After %q, RateLimit-Policy %q; want 3 and the policy", w.Header().Get("Retry-After"), w.Header()["RateLimit-Policy"])
	}
}

// Bitly takes its token alone in Authorization, as well as after
// "Bearer ", and its Node SDK sends it alone: the Bitly API takes a kurz
// key so, a wrong one still 403; kurz's own API still wants "Bearer <key>".
func TestBitlyTakesTheKeyWithoutBearer(t *testing.T) {
	env := newBitlyEnv(t)
	if w := env.handler.do("POST", "/v4/shorten", `{"long_url":"https://example.com/a"}`, "", "Authorization", shlinkGoodKey); w.Code != 201 {
		t.Errorf("the key alone: %d %s; want 201", w.Code, w.Body)
	}
	for _, auth := range []string{"kurz_k9_wrong", "Basic " + shlinkGoodKey, shlinkGoodKey + " x"} {
		w := env.handler.do("GET", "/v4/user", "", "", "Authorization", auth)
		bitlyErrorOf(t, w, 403, "FORBIDDEN")
	}
	if w := env.handler.do("GET", "/v1/links/abcd123", "", "", "Authorization", shlinkGoodKey); w.Code != 401 {
		t.Errorf("the key alone on kurz's own API: %d %s; want 401", w.Code, w.Body)
	}
}

// Every call is charged once as the kurz route it does the work of, its
// refusals after the key check included.
func TestBitlyCallsAreChargedAsTheirKurzTwin(t *testing.T) {
	env := newBitlyEnv(t, shlinkLink("abcd123"), shlinkLink("efgh456"))
	const stats = "GET /v1/links/{code}/stats"
	for _, tc := range []struct {
		method, target, body string
		status               int
		charged              string
	}{
		{"POST", "/v4/shorten", `{"long_url":"https://example.com/a"}`, 201, "POST /v1/links"},
		{"POST", "/v4/bitlinks", `{"long_url":5}`, 400, "POST /v1/links"},
		{"GET", "/v4/bitlinks/k.test/abcd123", "", 200, "GET /v1/links/{code}"},
		{"GET", "/v4/bitlinks/k.test%2Fabcd123", "", 200, "GET /v1/links/{code}"},
		{"GET", "/v4/bitlinks/bit.ly/abcd123", "", 200, "GET /v1/links/{code}"},
		{"GET", "/v4/bitlinks/other.example/abcd123", "", 404, "GET /v1/links/{code}"},
		{"GET", "/v4/bitlinks/k.test/abcd123/clicks", "", 200, stats},
		{"GET", "/v4/bitlinks/k.test%2Fabcd123/clicks/summary", "", 200, stats},
		{"GET", "/v4/bitlinks/k.test/abcd123/clicks?unit=minute", "", 400, stats},
		{"PATCH", "/v4/bitlinks/k.test/abcd123", `{"tags":["a"],"title":"t","archived":false}`, 200, "PATCH /v1/links/{code}"},
		{"PATCH", "/v4/bitlinks/k.test/abcd123", `{"archived":true}`, 400, "PATCH /v1/links/{code}"},
		{"POST", "/v4/expand", `{"bitlink_id":"k.test/abcd123"}`, 200, "GET /v1/links/{code}"},
		{"DELETE", "/v4/bitlinks/k.test/efgh456", "", 200, "DELETE /v1/links/{code}"},
		{"GET", "/v4/user", "", 200, "GET /v4/user"},
		{"GET", "/v4/groups", "", 200, "GET /v4/groups"},
		{"GET", "/v4/groups/acme", "", 200, "GET /v4/groups/{group_guid}"},
		{"GET", "/v4/groups/acme/bitlinks", "", 200, "GET /v1/links"},
		{"GET", "/v4/groups/acme/bitlinks?query=x", "", 400, "GET /v1/links"},
	} {
		w := env.do(tc.method, tc.target, tc.body, shlinkGoodKey)
		got := env.handler.limiter.takeCharged()
		if w.Code != tc.status || !slices.Equal(got, []string{tc.charged}) || len(w.Header()["RateLimit"]) != 1 {
			t.Errorf("%s %s: %d %s, charged %v; want %d charged as %s with its RateLimit fields",
				tc.method, tc.target, w.Code, strings.TrimSpace(w.Body.String()), got, tc.status, tc.charged)
		}
	}
	if u := env.handler.shortener.update; u == nil || !slices.Equal(u.GetUpdateMask().GetPaths(), []string{"tags", "title"}) {
		t.Errorf("PATCH sent %v; want tags and title changed", u)
	}
}

// The user and its one group are the tenant: its ID as login and guid.
func TestBitlyUserAndGroupsAreTheTenant(t *testing.T) {
	env := newBitlyEnv(t)
	u := object(t, env.do("GET", "/v4/user", "", shlinkGoodKey))
	if u["login"] != "acme" || u["name"] != "Acme Inc." || u["default_group_guid"] != "acme" {
		t.Errorf("user %v; want login and default_group_guid acme", u)
	}
	g := object(t, env.do("GET", "/v4/groups", "", shlinkGoodKey))
	groups, _ := g["groups"].([]any)
	if len(groups) != 1 || groups[0].(map[string]any)["guid"] != "acme" {
		t.Errorf("groups %v; want the one group acme", g)
	}
}

// A group's bitlinks come a page of size at a time, newest first, each
// page's pagination.next and search_after leading to the next; one tag
// filters them.
func TestBitlyGroupLinksPageBySearchAfter(t *testing.T) {
	env := newBitlyEnv(t, shlinkLink("abcd123", "x"), shlinkLink("efgh456"), shlinkLink("ijkl789", "x"))
	var ids []string
	target := "/v4/groups/acme/bitlinks?size=2"
	for range 3 {
		w := env.do("GET", target, "", shlinkGoodKey)
		p := object(t, w)
		for _, l := range p["links"].([]any) {
			ids = append(ids, l.(map[string]any)["id"].(string))
		}
		pg := p["pagination"].(map[string]any)
		if pg["size"] != float64(2) {
			t.Errorf("pagination %v; want size 2", pg)
		}
		if target = pg["next"].(string); target == "" {
			break
		}
		if next, _ := url.Parse(target); next.Query().Get("search_after") != pg["search_after"] {
			t.Errorf("next %q does not carry search_after %v", target, pg["search_after"])
		}
	}
	if want := []string{"k.test/abcd123", "k.test/efgh456", "k.test/ijkl789"}; !slices.Equal(ids, want) {
		t.Errorf("paged through %v; want %v", ids, want)
	}

	p := object(t, env.do("GET", "/v4/groups/acme/bitlinks?tags=x&tags=X", "", shlinkGoodKey))
	if n := len(p["links"].([]any)); n != 2 {
		t.Errorf("tagged x: %d links; want 2", n)
	}
	bitlyErrorOf(t, env.do("GET", "/v4/groups/acme/bitlinks?tags=x&tags=y", "", shlinkGoodKey), 400, "INVALID_ARG_TAGS")
	bitlyErrorOf(t, env.do("GET", "/v4/groups/acme/bitlinks?size=1001", "", shlinkGoodKey), 400, "INVALID_ARG_SIZE")
	if p := object(t, env.do("GET", "/v4/groups/acme/bitlinks?archived=on", "", shlinkGoodKey)); len(p["links"].([]any)) != 0 {
		t.Errorf("archived on: %v; want no links (kurz archives none)", p)
	}
}

// Clicks are counted per unit from analytics' hourly or daily series,
// newest first, bots left out; the summary is their sum; the units are
// bounded by what analytics answers.
func TestBitlyClicksByUnit(t *testing.T) {
	env := newBitlyEnv(t, shlinkLink("abcd123"))
	day := func(d int, total, bot int64) *analyticsv1.TimeBucket {
		return &analyticsv1.TimeBucket{StartTime: timestamppb.New(time.Date(2026, 3, d, 0, 0, 0, 0, time.UTC)),
			Counts: &analyticsv1.ClickCounts{Total: total, Bot: bot}}
	}
	env.analytics.series = []*analyticsv1.TimeBucket{day(2, 5, 1), day(5, 3, 0), day(10, 2, 0)}
	// 2026-03-11 is a Wednesday: the weeks of 2 March and 9 March.
	w := env.do("GET", "/v4/bitlinks/k.test/abcd123/clicks?unit=week&units=2&unit_reference=2026-03-11T12:00:00%2B0000", "", shlinkGoodKey)
	p := object(t, w)
	got, _ := p["link_clicks"].([]any)
	want := []map[string]any{{"clicks": float64(2), "date": "2026-03-09T00:00:00+0000"}, {"clicks": float64(7), "date": "2026-03-02T00:00:00+0000"}}
	if w.Code != 200 || len(got) != 2 || p["unit"] != "week" || p["units"] != float64(2) || p["unit_reference"] != "2026-03-11T12:00:00+0000" {
		t.Fatalf("clicks: %d %s", w.Code, w.Body)
	}
	for i := range want {
		if g := got[i].(map[string]any); g["clicks"] != want[i]["clicks"] || g["date"] != want[i]["date"] {
			t.Errorf("link_clicks[%d] = %v, want %v", i, g, want[i])
		}
	}
	asked := env.analytics.asked[0]
	if !asked.GetStartTime().AsTime().Equal(time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)) || asked.GetInterval() != analyticsv1.Interval_INTERVAL_DAY {
		t.Errorf("analytics asked %v; want days from 2 March", asked)
	}

	p = object(t, env.do("GET", "/v4/bitlinks/k.test/abcd123/clicks/summary", "", shlinkGoodKey))
	if p["total_clicks"] != float64(5) || p["unit"] != "day" || p["units"] != float64(-1) {
		t.Errorf("summary %v; want 5 clicks (7 less 2 bots) over every day", p)
	}
	bitlyErrorOf(t, env.do("GET", "/v4/bitlinks/k.test/abcd123/clicks?unit=minute", "", shlinkGoodKey), 400, "INVALID_ARG_UNIT")
	bitlyErrorOf(t, env.do("GET", "/v4/bitlinks/k.test/abcd123/clicks?unit=hour&units=745", "", shlinkGoodKey), 400, "INVALID_ARG_UNITS")
	bitlyErrorOf(t, env.do("GET", "/v4/bitlinks/k.test/abcd123/clicks?unit_reference=yesterday", "", shlinkGoodKey), 400, "INVALID_ARG_UNIT_REFERENCE")
}

// units -1 counts every unit since the link was made, up to the unit's
// bound, and each unit's range stays within analytics' bounds (400 days,
// 31 days of hours).
func TestBitlyRangeStarts(t *testing.T) {
	ref := time.Date(2026, 3, 11, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		unit    string
		units   int
		created time.Time
		want    int
	}{
		{"month", -1, time.Date(2026, 1, 20, 0, 0, 0, 0, time.UTC), 3},
		{"day", -1, ref.Add(time.Hour), 1},
		{"day", -1, ref.AddDate(-3, 0, 0), 400},
		{"hour", -1, ref.AddDate(-1, 0, 0), 744},
		{"week", 57, ref, 57},
		{"month", 13, ref, 13},
	} {
		r, err := bitlyRangeOf(url.Values{"unit": {tc.unit}, "units": {strconv.Itoa(tc.units)}})
		if err != nil {
			t.Fatal(err)
		}
		r.ref = ref
		starts := r.starts(tc.created)
		if len(starts) != tc.want {
			t.Errorf("%s × %d since %s: %d units, want %d", tc.unit, tc.units, tc.created, len(starts), tc.want)
			continue
		}
		limit := 400 * 24 * time.Hour
		if tc.unit == "hour" {
			limit = 31 * 24 * time.Hour
		}
		if span := ref.Sub(starts[len(starts)-1]); span > limit {
			t.Errorf("%s × %d spans %s, more than analytics answers (%s)", tc.unit, tc.units, span, limit)
		}
	}
}

// A PATCH takes a field given as null as not given, as Bitly does: its
// clients send every field they know, null when unset (the Ruby gem's
// Bitlink#update), and a null long_url or tags read as given refused the
// call or cleared the link's tags.
func TestBitlyEditTakesNullAsNotGiven(t *testing.T) {
	env := newBitlyEnv(t, shlinkLink("abcd123", "keep"))
	const nulls = `"archived":null,"created_at":null,"title":null,"deeplinks":null,"created_by":null,"client_id":null,"custom_bitlinks":null,"link":null,"id":null,"references":null`
	w := env.do("PATCH", "/v4/bitlinks/k.test/abcd123", `{"tags":["moved"],"long_url":null,`+nulls+`}`, shlinkGoodKey)
	u := env.handler.shortener.update
	if w.Code != 200 || u == nil || !slices.Equal(u.GetUpdateMask().GetPaths(), []string{"tags"}) {
		t.Errorf("tags with long_url null: %d %s, update %v; want 200 and tags changed only", w.Code, strings.TrimSpace(w.Body.String()), u)
	}
	env.handler.shortener.update = nil
	w = env.do("PATCH", "/v4/bitlinks/k.test/abcd123", `{"long_url":"https://example.com/new","tags":null,`+nulls+`}`, shlinkGoodKey)
	u = env.handler.shortener.update
	if w.Code != 200 || u == nil || !slices.Equal(u.GetUpdateMask().GetPaths(), []string{"long_url"}) {
		t.Errorf("long_url with tags null: %d %s, update %v; want 200 and long_url changed only (the tags kept)", w.Code, strings.TrimSpace(w.Body.String()), u)
	}
	env.handler.shortener.update = nil
	if w := env.do("PATCH", "/v4/bitlinks/k.test/abcd123", `{"tags":[],"long_url":""}`, shlinkGoodKey); w.Code != 400 {
		t.Errorf("long_url empty: %d %s; want 400 (an empty URL is not a null)", w.Code, w.Body)
	}
}

// A title is kept as Bitly keeps it: sent with a new link, changed by a
// PATCH (emptied by ""; null is not given), and answered when the link
// has one, left out when it has none.
func TestBitlyTitles(t *testing.T) {
	titled := shlinkLink("abcd123")
	titled.Title = "Spring sale"
	env := newBitlyEnv(t, titled)
	env.do("POST", "/v4/bitlinks", `{"long_url":"https://example.com/a","title":"Launch"}`, shlinkGoodKey)
	if c := env.handler.shortener.creates; len(c) != 1 || c[0].GetTitle() != "Launch" {
		t.Errorf("CreateLink %v; want the title Launch", c)
	}
	w := env.do("GET", "/v4/bitlinks/k.test/abcd123", "", shlinkGoodKey)
	if b := object(t, w); w.Code != 200 || b["title"] != "Spring sale" {
		t.Errorf("a titled link: %d %s; want its title", w.Code, w.Body)
	}
	for _, tc := range []struct {
		body, title string
		mask        []string
	}{
		{`{"title":"Summer sale"}`, "Summer sale", []string{"title"}},
		{`{"title":""}`, "", []string{"title"}},
		{`{"title":null,"tags":[]}`, "", []string{"tags"}},
	} {
		env.handler.shortener.update = nil
		env.do("PATCH", "/v4/bitlinks/k.test/abcd123", tc.body, shlinkGoodKey)
		u := env.handler.shortener.update
		if u == nil || !slices.Equal(u.GetUpdateMask().GetPaths(), tc.mask) || u.GetLink().GetTitle() != tc.title {
			t.Errorf("PATCH %s: update %v; want mask %v, title %q", tc.body, u, tc.mask, tc.title)
		}
	}
	untitled := bitlinkOf(shlinkLink("efgh456"), "acme")
	if b, _ := json.Marshal(untitled); strings.Contains(string(b), `"title"`) {
		t.Errorf("a link without a title: %s; want no title key", b)
	}
}

// A list refuses what it cannot honour rather than answer another page
// than asked: a page number past the first (kurz pages by search_after;
// R's urlshorteneR pages by number, and got the first page again for
// every page) and modified_after (the page was believed filtered).
// page=1 and parameters sent empty (the Ruby gem sends unset ones so)
// are taken.
func TestBitlyGroupLinksRefuseWhatTheyCannotHonour(t *testing.T) {
	env := newBitlyEnv(t, shlinkLink("abcd123"), shlinkLink("efgh456"))
	for _, tc := range []struct{ query, message string }{
		{"size=1&page=2", "INVALID_ARG_PAGE"},
		{"page=x", "INVALID_ARG_PAGE"},
		{"modified_after=1700000000", "INVALID_ARG_MODIFIED_AFTER"},
	} {
		bitlyErrorOf(t, env.do("GET", "/v4/groups/acme/bitlinks?"+tc.query, "", shlinkGoodKey), 400, tc.message)
	}
	for _, q := range []string{"size=1&page=1", "size=1&page&modified_after&keyword&query&tags"} {
		if w := env.do("GET", "/v4/groups/acme/bitlinks?"+q, "", shlinkGoodKey); w.Code != 200 {
			t.Errorf("?%s: %d %s; want 200", q, w.Code, w.Body)
		}
	}
}
