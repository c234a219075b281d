package httpapi

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/linkdomain"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/gateway/internal/keystore"
)

// Keys of the Shlink tests' key store: one valid key of tenant acme, one
// of a suspended tenant; any other is invalid.
const (
	shlinkGoodKey      = "kurz_k1_good"
	shlinkSuspendedKey = "kurz_k2_suspended"
)

// shlinkLimiter allows what it is asked, recording the route of every
// edge quota charge (domain api), once per unit of its cost, and counting
// the failed authentications charged to the auth rule; denyAPI refuses the
// edge quota instead, denyAbove the charges of a larger cost (as a rule
// holding no more, with capacity), denyRoute the charges of that route.
type shlinkLimiter struct {
	grpc.ClientConnInterface
	mu           sync.Mutex
	charged      []string
	authFailures int
	denyAPI      bool
	denyAbove    uint32
	capacity     bool
	denyRoute    string
	// delay allows the edge quota with this turn in a leaky bucket's
	// queue (a rule in queue mode).
	delay time.Duration
	// byRoute answers an allowed edge quota charge of a route (its
	// descriptor) in place of the per-api-key rule's 599 of 600.
	byRoute map[string]*ratelimitv1.CheckQuotaResponse
	// refuse, when set, refuses each edge quota check for which it
	// returns more than zero, with that as its retry; ask is the check's
	// place among the edge quota checks (asks), from 1.
	refuse func(ask int) time.Duration
	asks   int
}

func (l *shlinkLimiter) Invoke(_ context.Context, _ string, args, reply any, _ ...grpc.CallOption) error {
	req, resp := args.(*ratelimitv1.CheckQuotaRequest), reply.(*ratelimitv1.CheckQuotaResponse)
	l.mu.Lock()
	defer l.mu.Unlock()
	answer := &ratelimitv1.CheckQuotaResponse{Allowed: true, DecidingRule: "per-ip", Limit: 10, Remaining: 10}
	switch {
	case req.GetDomain() == DomainAPI:
		deny := l.denyAPI || (l.denyAbove > 0 && req.GetCost() > l.denyAbove) || req.GetDescriptors()["route"] == l.denyRoute
		l.asks++
		retry := 3 * time.Second
		if l.refuse != nil {
			if r := l.refuse(l.asks); r > 0 {
				deny, retry = true, r
			}
		}
		if !deny {
			for range max(req.GetCost(), 1) {
				l.charged = append(l.charged, req.GetDescriptors()["route"])
			}
		}
		answer = &ratelimitv1.CheckQuotaResponse{Allowed: !deny, DecidingRule: "per-api-key", Limit: 600, Remaining: 599}
		if deny {
			answer.Remaining, answer.RetryAfter = 0, durationpb.New(retry)
		}
		if deny && l.capacity {
			answer.Decisions = []*ratelimitv1.RuleDecision{{Rule: "per-api-key", Capacity: int64(l.denyAbove)}}
		}
		if a := l.byRoute[req.GetDescriptors()["route"]]; a != nil && !deny {
			answer = a
		}
		if !deny && l.delay > 0 {
			answer.Decisions = []*ratelimitv1.RuleDecision{{Rule: "per-api-key", Allowed: true, Delay: durationpb.New(l.delay)}}
		}
	case req.GetCost() > 0:
		l.authFailures++
		answer.Remaining = 9
	}
	proto.Merge(resp, answer)
	return nil
}

func (l *shlinkLimiter) takeCharged() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.charged
	l.charged = nil
	return out
}

// shlinkKeys knows shlinkGoodKey (tenant acme) and shlinkSuspendedKey.
type shlinkKeys struct{ KeyStore }

func (shlinkKeys) Authenticate(_ context.Context, key string) (keystore.Principal, error) {
	switch key {
	case shlinkGoodKey:
		return keystore.Principal{Tenant: "acme", KeyID: "k1"}, nil
	case shlinkSuspendedKey:
		return keystore.Principal{Tenant: "stopped", KeyID: "k2"}, keystore.ErrTenantSuspended
	}
	return keystore.Principal{}, keystore.ErrInvalidKey
}

// shlinkShortener keeps links in memory, newest first, and records what
// reaches it. A create of the URL of existing (CODE_MODE_FROM_URL), or of
// its code as alias, answers existing (created false); createErr refuses
// every create.
type shlinkShortener struct {
	shortenerv1.ShortenerServiceClient
	links     []*shortenerv1.Link
	existing  *shortenerv1.Link
	createErr error
	// cut ends every ListLinks page after this many links (0: never), as
	// the shortener ends a page early when its links pass 1 MiB.
	cut     int
	creates []*shortenerv1.CreateLinkRequest
	lists   []*shortenerv1.ListLinksRequest
	gets    []*shortenerv1.GetLinkRequest
	update  *shortenerv1.UpdateLinkRequest
	deleted []*shortenerv1.DeleteLinkRequest
	// domains are each tenant's custom domains, by tenant; domainLists
	// counts the ListDomains calls.
	domains     map[string][]*shortenerv1.Domain
	domainLists int
}

// shlinkDefaultDomain is the host of the short URLs on the default domain
// of the Shlink tests (shlinkLink's).
const shlinkDefaultDomain = "k.test"

// ListDomains answers the domains of the tenant the call carries, as the
// shortener lists only its caller's.
func (s *shlinkShortener) ListDomains(ctx context.Context, _ *shortenerv1.ListDomainsRequest, _ ...grpc.CallOption) (*shortenerv1.ListDomainsResponse, error) {
	s.domainLists++
	md, _ := metadata.FromOutgoingContext(ctx)
	tenants := md.Get(callmeta.TenantKey)
	if len(tenants) != 1 {
		return nil, status.Error(codes.Unauthenticated, "no tenant")
	}
	return &shortenerv1.ListDomainsResponse{Domains: s.domains[tenants[0]]}, nil
}

var shlinkCreated = time.Date(2026, 3, 1, 10, 30, 0, 0, time.UTC)

func (s *shlinkShortener) CreateLink(_ context.Context, in *shortenerv1.CreateLinkRequest, _ ...grpc.CallOption) (*shortenerv1.CreateLinkResponse, error) {
	s.creates = append(s.creates, proto.Clone(in).(*shortenerv1.CreateLinkRequest))
	if s.createErr != nil {
		return nil, s.createErr
	}
	if e := s.existing; e != nil && ((in.GetMode() == shortenerv1.CodeMode_CODE_MODE_FROM_URL && in.GetLongUrl() == e.GetLongUrl()) || in.GetCustomAlias() == e.GetCode()) {
		return &shortenerv1.CreateLinkResponse{Link: e}, nil
	}
	code := in.GetCustomAlias()
	if code == "" {
		code = fmt.Sprintf("new%04d", len(s.creates))
	}
	l := &shortenerv1.Link{Code: code, ShortUrl: "https://k.test/" + code, LongUrl: in.GetLongUrl(), Tenant: "acme",
		CreateTime: timestamppb.New(shlinkCreated), ExpireTime: in.GetExpireTime(), MaxVisits: in.GetMaxVisits(), Title: in.GetTitle()}
	for _, t := range in.GetTags() {
		l.Tags = append(l.Tags, strings.ToLower(t))
	}
	if d := in.GetDomain(); d != "" {
		l.Domain = &d
	}
	return &shortenerv1.CreateLinkResponse{Link: l, Created: true}, nil
}

func (s *shlinkShortener) find(code, domain string) (*shortenerv1.Link, error) {
	for _, l := range s.links {
		if l.GetCode() == code && l.GetDomain() == domain {
			return l, nil
		}
	}
	return nil, rpcerr.WithDetails(codes.NotFound, "no such link: check the code (links of other tenants are not visible)")
}

func (s *shlinkShortener) GetLink(_ context.Context, in *shortenerv1.GetLinkRequest, _ ...grpc.CallOption) (*shortenerv1.GetLinkResponse, error) {
	s.gets = append(s.gets, proto.Clone(in).(*shortenerv1.GetLinkRequest))
	l, err := s.find(in.GetCode(), in.GetDomain())
	if err != nil {
		return nil, err
	}
	return &shortenerv1.GetLinkResponse{Link: l}, nil
}

// ListLinks pages through the links carrying the request's tag, its page
// tokens the index of the next link.
func (s *shlinkShortener) ListLinks(_ context.Context, in *shortenerv1.ListLinksRequest, _ ...grpc.CallOption) (*shortenerv1.ListLinksResponse, error) {
	s.lists = append(s.lists, proto.Clone(in).(*shortenerv1.ListLinksRequest))
	var tagged []*shortenerv1.Link
	for _, l := range s.links {
		if in.GetTag() == "" || slices.Contains(l.GetTags(), in.GetTag()) {
			tagged = append(tagged, l)
		}
	}
	start := 0
	if in.GetPageToken() != "" {
		_, _ = fmt.Sscan(in.GetPageToken(), &start)
	}
	end := min(start+int(in.GetPageSize()), len(tagged))
	if s.cut > 0 {
		end = min(end, start+s.cut)
	}
	resp := &shortenerv1.ListLinksResponse{Links: tagged[start:end]}
	if end < len(tagged) {
		resp.NextPageToken = fmt.Sprint(end)
	}
	return resp, nil
}

func (s *shlinkShortener) UpdateLink(_ context.Context, in *shortenerv1.UpdateLinkRequest, _ ...grpc.CallOption) (*shortenerv1.UpdateLinkResponse, error) {
	s.update = proto.Clone(in).(*shortenerv1.UpdateLinkRequest)
	l, err := s.find(in.GetLink().GetCode(), in.GetLink().GetDomain())
	if err != nil {
		return nil, err
	}
	l = proto.Clone(l).(*shortenerv1.Link)
	for _, p := range in.GetUpdateMask().GetPaths() {
		switch p {
		case "long_url":
			l.LongUrl = in.GetLink().GetLongUrl()
		case "expire_time":
			l.ExpireTime = in.GetLink().GetExpireTime()
		case "max_visits":
			l.MaxVisits = in.GetLink().GetMaxVisits()
		case "tags":
			l.Tags = in.GetLink().GetTags()
		case "title":
			l.Title = in.GetLink().GetTitle()
		}
	}
	return &shortenerv1.UpdateLinkResponse{Link: l}, nil
}

func (s *shlinkShortener) DeleteLink(_ context.Context, in *shortenerv1.DeleteLinkRequest, _ ...grpc.CallOption) (*shortenerv1.DeleteLinkResponse, error) {
	s.deleted = append(s.deleted, proto.Clone(in).(*shortenerv1.DeleteLinkRequest))
	if _, err := s.find(in.GetCode(), in.GetDomain()); err != nil {
		return nil, err
	}
	return &shortenerv1.DeleteLinkResponse{}, nil
}

// shlinkAnalytics answers counts (or err) to every GetLinkStats, and to
// every link of a GetLinksClickCounts (byCode's counts for its codes).
type shlinkAnalytics struct {
	analyticsv1.AnalyticsServiceClient
	counts  *analyticsv1.ClickCounts
	byCode  map[string]*analyticsv1.ClickCounts
	err     error
	asked   []*analyticsv1.GetLinkStatsRequest
	batches []*analyticsv1.GetLinksClickCountsRequest
}

func (s *shlinkAnalytics) GetLinksClickCounts(_ context.Context, in *analyticsv1.GetLinksClickCountsRequest, _ ...grpc.CallOption) (*analyticsv1.GetLinksClickCountsResponse, error) {
	s.batches = append(s.batches, proto.Clone(in).(*analyticsv1.GetLinksClickCountsRequest))
	if s.err != nil {
		return nil, s.err
	}
	resp := &analyticsv1.GetLinksClickCountsResponse{}
	for _, l := range in.GetLinks() {
		lc := &analyticsv1.LinkClickCounts{Code: l.GetCode(), Counts: cmp.Or(s.byCode[l.GetCode()], s.counts)}
		if l.GetDomain() != "" {
			lc.Domain = proto.String(l.GetDomain())
		}
		resp.Links = append(resp.Links, lc)
	}
	return resp, nil
}

func (s *shlinkAnalytics) GetLinkStats(_ context.Context, in *analyticsv1.GetLinkStatsRequest, _ ...grpc.CallOption) (*analyticsv1.GetLinkStatsResponse, error) {
	s.asked = append(s.asked, proto.Clone(in).(*analyticsv1.GetLinkStatsRequest))
	if s.err != nil {
		return nil, s.err
	}
	return &analyticsv1.GetLinkStatsResponse{Code: in.GetCode(), Counts: s.counts}, nil
}

// shlinkEnv is an API with the Shlink fakes, served as the gateway serves
// it (Wrap over its routes), and what it was built on.
type shlinkEnv struct {
	t         *testing.T
	handler   http.Handler
	limiter   *shlinkLimiter
	shortener *shlinkShortener
	analytics *shlinkAnalytics
	ready     bool
	logs      *servertest.SyncBuffer // the API's log, as text
}

func newShlinkEnv(t *testing.T, links ...*shortenerv1.Link) *shlinkEnv {
	t.Helper()
	env := &shlinkEnv{t: t, limiter: &shlinkLimiter{}, shortener: &shlinkShortener{links: links},
		analytics: &shlinkAnalytics{counts: &analyticsv1.ClickCounts{Total: 7, Human: 4, Bot: 2, Flood: 1}}, ready: true,
		logs: &servertest.SyncBuffer{}}
	env.handler = serveFakes(t, env.limiter, Deps{Shortener: env.shortener, Analytics: env.analytics,
		Log: slog.New(slog.NewTextHandler(env.logs, nil)), Ready: func() bool { return env.ready }})
	return env
}

// do sends method target with body and the key in X-Api-Key ("" sends
// none), plus the header pairs in hdr.
func (env *shlinkEnv) do(method, target, body, key string, hdr ...string) *httptest.ResponseRecorder {
	env.t.Helper()
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if key != "" {
		r.Header.Set("X-Api-Key", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	env.handler.ServeHTTP(w, r)
	return w
}

// object decodes w's body as a JSON object, failing the test if it is not.
func object(t *testing.T, w *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
		t.Fatalf("%d: body is not a JSON object: %v\n%s", w.Code, err, w.Body)
	}
	return m
}

// shlinkProblemOf checks that w is a problem detail of status with
// Shlink's type kind (a full URI when it has a scheme, else Shlink's), and
// returns it.
func shlinkProblemOf(t *testing.T, w *httptest.ResponseRecorder, status int, kind string) map[string]any {
	t.Helper()
	p := object(t, w)
	if !strings.Contains(kind, "://") {
		kind = shlinkProblemType + kind
	}
	if w.Code != status || w.Header().Get("Content-Type") != "application/problem+json" || p["type"] != kind ||
		p["status"] != float64(status) || p["title"] == "" || p["detail"] == "" || p["requestId"] == "" ||
		w.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("got %d %s %s, want a problem %d of type %s", w.Code, w.Header().Get("Content-Type"), w.Body, status, kind)
	}
	return p
}

// strList is v as a list of strings (nil when it is not one).
func strList(v any) []string {
	l, ok := v.([]any)
	if !ok {
		return nil
	}
	out := []string{}
	for _, x := range l {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

func shlinkLink(code string, tags ...string) *shortenerv1.Link {
	return &shortenerv1.Link{Code: code, ShortUrl: "https://k.test/" + code, LongUrl: "https://example.com/" + code,
		Tenant: "acme", CreateTime: timestamppb.New(shlinkCreated), Tags: tags}
}

// Without X-Api-Key a Shlink route answers Shlink's missing-authentication
// (a key in Authorization is not Shlink's way, and a key in the URL is
// refused as exposed), charging nothing and counting no failure; a wrong
// key is invalid-api-key and counts as a failed authentication.
func TestShlinkRoutesTakeTheKeyInXApiKey(t *testing.T) {
	env := newShlinkEnv(t)
	w := env.do("GET", "/rest/v3/short-urls", "", "")
	p := shlinkProblemOf(t, w, 401, "missing-authentication")
	if got := strList(p["expectedHeaders"]); !slices.Equal(got, []string{"X-Api-Key"}) {
		t.Errorf("expectedHeaders %v, want [X-Api-Key]", got)
	}
	shlinkProblemOf(t, env.do("GET", "/rest/v3/short-urls", "", "", "Authorization", "Bearer "+shlinkGoodKey), 401, "missing-authentication")
	p = shlinkProblemOf(t, env.do("GET", "/rest/v3/short-urls?apiKey="+shlinkGoodKey, "", shlinkGoodKey), 400, "invalid-data")
	if !strings.Contains(p["detail"].(string), "revoke it") || strings.Contains(fmt.Sprint(p), shlinkGoodKey) {
		t.Errorf("key in the URL: %v; want it refused as exposed, without the key", p)
	}
	if got := env.limiter.takeCharged(); len(got) != 0 || env.limiter.authFailures != 0 {
		t.Errorf("requests without a key charged %v and counted %d failures; want none", got, env.limiter.authFailures)
	}

	shlinkProblemOf(t, env.do("GET", "/rest/v3/short-urls", "", "kurz_k9_wrong"), 401, "invalid-api-key")
	shlinkProblemOf(t, env.do("GET", "/rest/v3/short-urls", "", "two keys"), 401, "invalid-api-key")
	if env.limiter.authFailures != 2 {
		t.Errorf("%d failed authentications counted, want 2", env.limiter.authFailures)
	}
}

// Every call with a valid key is charged once to the edge quota as the
// kurz route it mirrors, refusals after the key check included (a body,
// a version, a filter or a code refused; the visits not served; a
// suspended tenant), so that no Shlink call is unmetered, and once more
// as GET /v1/links/{code}/stats when it answers a visitsSummary; a denial is
// kurz's 429 in the problem shape, with Retry-After and the RateLimit
// fields.
func TestShlinkCallsAreChargedAsTheKurzRouteTheyMirror(t *testing.T) {
	env := newShlinkEnv(t, shlinkLink("abcd123"))
	const stats = "GET /v1/links/{code}/stats"
	for _, tc := range []struct {
		method, target, body string
		key                  string
		status               int
		charged              []string
	}{
		{"POST", "/rest/v3/short-urls", `{"longUrl":"https://example.com/a"}`, shlinkGoodKey, 200, []string{"POST /v1/links"}},
		{"POST", "/rest/v2/short-urls", `{"longUrl": 5}`, shlinkGoodKey, 400, []string{"POST /v1/links"}},
		{"POST", "/rest/v9/short-urls", `{"longUrl":"https://example.com/a"}`, shlinkGoodKey, 404, []string{"POST /v1/links"}},
		{"GET", "/rest/v3/short-urls", "", shlinkGoodKey, 200, []string{"GET /v1/links", stats}},
		{"GET", "/rest/v3/short-urls?searchTerm=x", "", shlinkGoodKey, 400, []string{"GET /v1/links"}},
		{"GET", "/rest/v3/short-urls/abcd123", "", shlinkGoodKey, 200, []string{"GET /v1/links/{code}", stats}},
		{"GET", "/rest/v3/short-urls/nope", "", shlinkGoodKey, 404, []string{"GET /v1/links/{code}"}},
		{"PATCH", "/rest/v3/short-urls/abcd123", `{"tags":["a"]}`, shlinkGoodKey, 200, []string{"PATCH /v1/links/{code}", stats}},
		{"DELETE", "/rest/v3/short-urls/abcd123", "", shlinkGoodKey, 204, []string{"DELETE /v1/links/{code}"}},
		{"GET", "/rest/v3/short-urls/abcd123/visits", "", shlinkGoodKey, 501, []string{stats}},
		{"GET", "/rest/v3/domains", "", shlinkGoodKey, 200, []string{"GET /v1/domains"}},
		{"GET", "/rest/v2/domains", "", shlinkSuspendedKey, 403, []string{"GET /v1/domains"}},
		{"GET", "/rest/v3/short-urls", "", shlinkSuspendedKey, 403, []string{"GET /v1/links"}},
		{"POST", "/rest/v3/short-urls", `{}`, shlinkSuspendedKey, 403, []string{"POST /v1/links"}},
	} {
		w := env.do(tc.method, tc.target, tc.body, tc.key)
		got := env.limiter.takeCharged()
		if w.Code != tc.status || !slices.Equal(got, tc.charged) || len(w.Header()["RateLimit"]) != 1 {
			t.Errorf("%s %s (%s): %d, charged %v, RateLimit %q; want %d charged as %v with its RateLimit fields",
				tc.method, tc.target, tc.key, w.Code, got, w.Header()["RateLimit"], tc.status, tc.charged)
		}
	}

	env.limiter.denyAPI = true
	w := env.do("GET", "/rest/v3/short-urls", "", shlinkGoodKey)
	p := shlinkProblemOf(t, w, 429, "https://kurz.dev/problems/resource-exhausted")
	if w.Header().Get("Retry-After") != "3" || len(w.Header()["RateLimit-Policy"]) != 1 || p["reason"] != "RATE_LIMITED" {
		t.Errorf("denied: Retry-After %q, RateLimit-Policy %q, %v; want 3, the policy and reason RATE_LIMITED",
			w.Header().Get("Retry-After"), w.Header()["RateLimit-Policy"], p)
	}
}

// A create takes Shlink's fields to CreateLink's (customSlug the alias,
// validUntil the expiry, title), ignores the ones kurz has no use for, and
// answers 200 with Shlink's ShortUrl: dates as Shlink writes them, meta,
// domain, the title, and the new link's visits, none.
func TestShlinkCreateMapsShlinksFields(t *testing.T) {
	env := newShlinkEnv(t)
	w := env.do("POST", "/rest/v3/short-urls", `{"longUrl":"https://example.com/page","customSlug":"my-slug","tags":["Launch","news"],
		"validUntil":"2030-01-02T03:04:05+02:00","maxVisits":100,"domain":"go.acme.test","title":"A page","crawlable":true,
		"forwardQuery":true,"shortCodeLength":4,"validateUrl":false,"unknownField":{"x":1}}`, shlinkGoodKey)
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" || w.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("create: %d %s %s", w.Code, w.Header(), w.Body)
	}
	got := env.shortener.creates[0]
	want := &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/page", Mode: shortenerv1.CodeMode_CODE_MODE_CUSTOM,
		CustomAlias: "my-slug", Tags: []string{"Launch", "news"}, MaxVisits: 100, Domain: "go.acme.test", Title: "A page",
		ExpireTime: timestamppb.New(time.Date(2030, 1, 2, 1, 4, 5, 0, time.UTC))}
	if !proto.Equal(got, want) {
		t.Errorf("CreateLink got %v\nwant %v", got, want)
	}
	const answer = `{"shortCode":"my-slug","shortUrl":"https://k.test/my-slug","longUrl":"https://example.com/page",` +
		`"dateCreated":"2026-03-01T10:30:00+00:00","visitsSummary":{"total":0,"nonBots":0,"bots":0},"tags":["launch","news"],` +
		`"meta":{"validSince":null,"validUntil":"2030-01-02T01:04:05+00:00","maxVisits":100},"domain":"go.acme.test",` +
		`"title":"A page","crawlable":false,"forwardQuery":false,"hasRedirectRules":false}` + "\n"
	if w.Body.String() != answer {
		t.Errorf("answer\n%s\nwant\n%s", w.Body, answer)
	}
	if len(env.analytics.asked) != 0 {
		t.Errorf("a new link's visits were asked of analytics: %v", env.analytics.asked)
	}

	w = env.do("POST", "/rest/v3/short-urls", `{"longUrl":"https://example.com/plain","maxVisits":null,"validUntil":null,"validSince":null}`, shlinkGoodKey)
	if got := env.shortener.creates[1]; w.Code != 200 || got.GetMode() != shortenerv1.CodeMode_CODE_MODE_UNSPECIFIED || got.ExpireTime != nil || got.GetMaxVisits() != 0 {
		t.Errorf("a plain create: %d %s, CreateLink %v; want a sequential code, no expiry, no visit limit", w.Code, w.Body, got)
	}
	if m := object(t, w)["meta"]; fmt.Sprint(m) != "map[maxVisits:<nil> validSince:<nil> validUntil:<nil>]" {
		t.Errorf("meta %v, want every field null", m)
	}
}

// What kurz cannot honour in a create is refused with Shlink's
// invalid-data naming every field at fault (validSince, a wrong type, a
// missing longUrl, a maxVisits of 0), before anything is created; the
// shortener's refusals are named by Shlink's names of their fields; a
// slug already taken, by another link or as the caller's own link to the
// same URL, is Shlink's non-unique-slug, 400.
func TestShlinkCreateRefusals(t *testing.T) {
	env := newShlinkEnv(t)
	for _, tc := range []struct {
		body    string
		invalid []string
	}{
		{`{"longUrl":"https://example.com/","validSince":"2030-01-01T00:00:00Z"}`, []string{"validSince"}},
		{`{"longUrl":7,"tags":"news","findIfExists":"yes","validUntil":"tomorrow","maxVisits":0}`,
			[]string{"longUrl", "tags", "validUntil", "maxVisits", "findIfExists"}},
		{`{"customSlug":"abcd"}`, []string{"longUrl"}},
		{`{"longUrl":"https://example.com/","maxVisits":-3}`, []string{"maxVisits"}},
		{`{"longUrl":"https://example.com/","longUrl":"https://evil.example/"}`, []string{}},
		{`[1,2]`, []string{}},
		{``, []string{}},
	} {
		w := env.do("POST", "/rest/v3/short-urls", tc.body, shlinkGoodKey)
		p := shlinkProblemOf(t, w, 400, "invalid-data")
		if got := strList(p["invalidElements"]); !slices.Equal(got, tc.invalid) {
			t.Errorf("body %s: invalidElements %v, want %v (%s)", tc.body, got, tc.invalid, w.Body)
		}
	}
	if len(env.shortener.creates) != 0 {
		t.Errorf("refused bodies reached CreateLink: %v", env.shortener.creates)
	}

	env.shortener.createErr = rpcerr.BadRequest("long_url", "URL_SCHEME_NOT_ALLOWED", "only http and https URLs can be shortened")
	p := shlinkProblemOf(t, env.do("POST", "/rest/v3/short-urls", `{"longUrl":"ftp://example.com/"}`, shlinkGoodKey), 400, "invalid-data")
	if got := strList(p["invalidElements"]); !slices.Equal(got, []string{"longUrl"}) || p["reason"] != "URL_SCHEME_NOT_ALLOWED" {
		t.Errorf("a refused URL: %v; want invalidElements [longUrl] and kurz's reason", p)
	}

	env.shortener.createErr = rpcerr.WithDetails(codes.AlreadyExists, `the alias "taken1" is already taken; choose another`, rpcerr.Info("ALIAS_TAKEN", nil))
	p = shlinkProblemOf(t, env.do("POST", "/rest/v3/short-urls", `{"longUrl":"https://example.com/","customSlug":"taken1"}`, shlinkGoodKey), 400, "non-unique-slug")
	if p["customSlug"] != "taken1" || p["title"] != "Invalid custom slug" || p["reason"] != "ALIAS_TAKEN" {
		t.Errorf("a taken slug: %v; want Shlink's non-unique-slug naming it", p)
	}

	env.shortener.createErr = nil
	env.shortener.existing = shlinkLink("mine1")
	p = shlinkProblemOf(t, env.do("POST", "/rest/v3/short-urls", `{"longUrl":"https://example.com/mine1","customSlug":"mine1","domain":"go.acme.test"}`, shlinkGoodKey), 400, "non-unique-slug")
	if p["customSlug"] != "mine1" || p["domain"] != "go.acme.test" {
		t.Errorf("a slug that is the caller's link to the same URL, without findIfExists: %v; want non-unique-slug", p)
	}
}

// A key given twice is refused by name (encoding/json would keep the
// last, a proxy may read the first), a long one by a bounded start of it:
// a key may be as long as the body.
func TestShlinkRefusesAKeyGivenTwice(t *testing.T) {
	env := newShlinkEnv(t)
	long := strings.Repeat("k", 1000) // the test gateway takes bodies of 4 KiB
	for body, want := range map[string]string{
		`{"longUrl":"https://example.com/","longUrl":"https://evil.example/"}`: `invalid JSON body: field "longUrl" appears twice`,
		`{"` + long + `":1,"` + long + `":2}`:                                  `invalid JSON body: field "` + long[:64] + `…" appears twice`,
	} {
		p := shlinkProblemOf(t, env.do("POST", "/rest/v3/short-urls", body, shlinkGoodKey), 400, "invalid-data")
		if p["detail"] != want {
			t.Errorf("body %.80s: detail %.200q, want %.200q", body, p["detail"], want)
		}
	}
}

// findIfExists asks CreateLink for the URL's link (CODE_MODE_FROM_URL) and
// answers it, with its visits, when it has the settings the request
// gives; when it has other ones, Shlink makes a new link, and so does
// kurz (a sequential code). With a customSlug it answers the caller's
// link of that slug to the same URL.
func TestShlinkFindIfExists(t *testing.T) {
	env := newShlinkEnv(t)
	env.shortener.existing = shlinkLink("found12", "news")
	w := env.do("POST", "/rest/v3/short-urls", `{"longUrl":"https://example.com/found12","findIfExists":true,"tags":["News"]}`, shlinkGoodKey)
	m := object(t, w)
	if w.Code != 200 || m["shortCode"] != "found12" || fmt.Sprint(m["visitsSummary"]) != "map[bots:2 nonBots:5 total:7]" {
		t.Errorf("findIfExists, same tags: %d %s; want the found link with its visits", w.Code, w.Body)
	}
	if got := env.shortener.creates; len(got) != 1 || got[0].GetMode() != shortenerv1.CodeMode_CODE_MODE_FROM_URL {
		t.Errorf("CreateLink calls %v, want one in CODE_MODE_FROM_URL", got)
	}

	w = env.do("POST", "/rest/v3/short-urls", `{"longUrl":"https://example.com/found12","findIfExists":true,"tags":["other"],"maxVisits":5}`, shlinkGoodKey)
	m = object(t, w)
	if got := env.shortener.creates[1:]; w.Code != 200 || m["shortCode"] == "found12" || len(got) != 2 ||
		got[1].GetMode() != shortenerv1.CodeMode_CODE_MODE_SEQUENTIAL || got[1].GetMaxVisits() != 5 {
		t.Errorf("findIfExists, other settings: %d %s, CreateLink %v; want a new link with the settings", w.Code, w.Body, got)
	}

	w = env.do("POST", "/rest/v3/short-urls", `{"longUrl":"https://example.com/found12","findIfExists":true,"customSlug":"found12"}`, shlinkGoodKey)
	if m := object(t, w); w.Code != 200 || m["shortCode"] != "found12" {
		t.Errorf("findIfExists with the link's slug: %d %s; want the link", w.Code, w.Body)
	}
}

// GET one link answers it with its lifetime visits (kurz's bots as bots,
// the rest as nonBots), from its domain (?domain=); when analytics cannot
// tell, the link without visitsSummary. An unknown code is Shlink's
// short-url-not-found naming it, a code kurz could not have issued
// (a long one) too, without repeating it.
func TestShlinkGetOneLink(t *testing.T) {
	l := shlinkLink("abcd123", "news")
	d := "go.acme.test"
	l.Domain, l.ExpireTime, l.MaxVisits = &d, timestamppb.New(time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)), 50
	l.Rules = []*shortenerv1.RedirectRule{{Name: "de", Url: "https://example.com/de"}}
	env := newShlinkEnv(t, l)
	w := env.do("GET", "/rest/v3/short-urls/abcd123?domain=go.acme.test&unknown=1", "", shlinkGoodKey)
	const answer = `{"shortCode":"abcd123","shortUrl":"https://k.test/abcd123","longUrl":"https://example.com/abcd123",` +
		`"dateCreated":"2026-03-01T10:30:00+00:00","visitsSummary":{"total":7,"nonBots":5,"bots":2},"tags":["news"],` +
		`"meta":{"validSince":null,"validUntil":"2031-05-06T07:08:09+00:00","maxVisits":50},"domain":"go.acme.test",` +
		`"title":null,"crawlable":false,"forwardQuery":false,"hasRedirectRules":true}` + "\n"
	if w.Code != 200 || w.Body.String() != answer {
		t.Errorf("GET: %d\n%s\nwant\n%s", w.Code, w.Body, answer)
	}
	if a := env.analytics.asked; len(a) != 1 || a[0].GetCode() != "abcd123" || a[0].GetDomain() != d ||
		!a[0].GetStartTime().AsTime().Equal(shlinkCreated) {
		t.Errorf("stats asked %v, want the link's, since it was made", a)
	}

	env.analytics.err = rpcerr.WithDetails(codes.Unavailable, "analytics is down")
	w = env.do("GET", "/rest/v3/short-urls/abcd123?domain=go.acme.test", "", shlinkGoodKey)
	if m := object(t, w); w.Code != 200 || m["visitsSummary"] != nil || m["shortCode"] != "abcd123" {
		t.Errorf("GET while analytics is down: %d %s; want the link without visitsSummary", w.Code, w.Body)
	}

	p := shlinkProblemOf(t, env.do("GET", "/rest/v3/short-urls/abcd123", "", shlinkGoodKey), 404, "short-url-not-found")
	if p["shortCode"] != "abcd123" || p["domain"] != nil || p["detail"] != `No URL found with short code "abcd123"` {
		t.Errorf("a link not on the default domain: %v", p)
	}
	long := strings.Repeat("x", 2000)
	w = env.do("GET", "/rest/v3/short-urls/"+long, "", shlinkGoodKey)
	if shlinkProblemOf(t, w, 404, "short-url-not-found"); strings.Contains(w.Body.String(), "xxxxxxxx") {
		t.Errorf("an implausible code was repeated: %s", w.Body)
	}
	if len(env.shortener.gets) != 3 {
		t.Errorf("%d GetLink calls, want 3 (none for a code kurz could not have issued)", len(env.shortener.gets))
	}
}

// A visitsSummary is a statistics query over up to 400 days, the work of
// GET /v1/links/{code}/stats: it is charged as that route too, so that a
// rule on it holds over Shlink's GET, PATCH and findIfExists as it does
// over YOURLS's url-stats. When that charge is refused the link is
// answered without it, analytics not asked.
func TestShlinkVisitsSummaryIsChargedAsStats(t *testing.T) {
	const stats = "GET /v1/links/{code}/stats"
	env := newShlinkEnv(t, shlinkLink("abcd123"))
	env.shortener.existing = shlinkLink("found12")
	for _, tc := range []struct {
		method, target, body string
		charged              []string
	}{
		{"GET", "/rest/v3/short-urls/abcd123", "", []string{"GET /v1/links/{code}", stats}},
		{"PATCH", "/rest/v3/short-urls/abcd123", `{"maxVisits":5}`, []string{"PATCH /v1/links/{code}", stats}},
		{"POST", "/rest/v3/short-urls", `{"longUrl":"https://example.com/found12","findIfExists":true}`, []string{"POST /v1/links", stats}},
	} {
		env.limiter.denyRoute = ""
		w := env.do(tc.method, tc.target, tc.body, shlinkGoodKey)
		if got := env.limiter.takeCharged(); w.Code != 200 || object(t, w)["visitsSummary"] == nil || !slices.Equal(got, tc.charged) {
			t.Errorf("%s %s: %d %s, charged %v; want 200 with visitsSummary, charged %v", tc.method, tc.target, w.Code, w.Body, got, tc.charged)
		}
		env.limiter.denyRoute, env.analytics.asked = stats, nil
		w = env.do(tc.method, tc.target, tc.body, shlinkGoodKey)
		m := object(t, w)
		if _, has := m["visitsSummary"]; w.Code != 200 || has || len(env.analytics.asked) != 0 {
			t.Errorf("%s %s, the stats route refused: %d %s, analytics asked %d times; want 200 without visitsSummary, analytics not asked",
				tc.method, tc.target, w.Code, w.Body, len(env.analytics.asked))
		}
		env.limiter.takeCharged()
	}
}

// PATCH changes the fields the body gives (null clears validUntil,
// maxVisits and title; a title left out stays, as in Shlink), answering
// the link as changed; a body of fields kurz ignores changes nothing and
// answers the link; validSince is refused.
// DELETE answers 204, an unknown code short-url-not-found.
func TestShlinkEditAndDelete(t *testing.T) {
	l := shlinkLink("abcd123")
	l.ExpireTime, l.MaxVisits = timestamppb.New(time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)), 9
	env := newShlinkEnv(t, l)
	w := env.do("PATCH", "/rest/v3/short-urls/abcd123", `{"longUrl":"https://example.com/new","validUntil":null,"maxVisits":null,"tags":["x"],"title":"t"}`, shlinkGoodKey)
	m := object(t, w)
	if u := env.shortener.update; w.Code != 200 || !slices.Equal(u.GetUpdateMask().GetPaths(), []string{"long_url", "expire_time", "max_visits", "tags", "title"}) ||
		u.GetLink().GetTitle() != "t" || u.GetLink().ExpireTime != nil || u.GetLink().GetMaxVisits() != 0 || u.GetLink().GetLongUrl() != "https://example.com/new" {
		t.Errorf("PATCH: %d %s, UpdateLink %v", w.Code, w.Body, u)
	}
	if m["longUrl"] != "https://example.com/new" || m["title"] != "t" || fmt.Sprint(m["meta"]) != "map[maxVisits:<nil> validSince:<nil> validUntil:<nil>]" || m["visitsSummary"] == nil {
		t.Errorf("PATCH answer %s; want the changed link with its visits", w.Body)
	}

	env.shortener.links[0].Title = "kept"
	w = env.do("PATCH", "/rest/v3/short-urls/abcd123", `{"maxVisits":3}`, shlinkGoodKey)
	if m := object(t, w); w.Code != 200 || slices.Contains(env.shortener.update.GetUpdateMask().GetPaths(), "title") || m["title"] != "kept" {
		t.Errorf("PATCH without title: %d %s, UpdateLink %v; want the title left as it is", w.Code, w.Body, env.shortener.update)
	}
	for _, body := range []string{`{"title":null}`, `{"title":""}`} {
		w = env.do("PATCH", "/rest/v3/short-urls/abcd123", body, shlinkGoodKey)
		if m := object(t, w); w.Code != 200 || !slices.Equal(env.shortener.update.GetUpdateMask().GetPaths(), []string{"title"}) ||
			env.shortener.update.GetLink().GetTitle() != "" || m["title"] != nil {
			t.Errorf("PATCH %s: %d %s, UpdateLink %v; want the title cleared, answered null", body, w.Code, w.Body, env.shortener.update)
		}
	}
	p := shlinkProblemOf(t, env.do("PATCH", "/rest/v3/short-urls/abcd123", `{"title":"a\u0007bell"}`, shlinkGoodKey), 400, "invalid-data")
	if got := strList(p["invalidElements"]); !slices.Equal(got, []string{"title"}) {
		t.Errorf("PATCH of a title with a control character: %v; want title named", p)
	}

	env.shortener.update = nil
	w = env.do("PATCH", "/rest/v3/short-urls/abcd123", `{"crawlable":true,"forwardQuery":true}`, shlinkGoodKey)
	if m := object(t, w); w.Code != 200 || env.shortener.update != nil || m["shortCode"] != "abcd123" {
		t.Errorf("PATCH of ignored fields: %d %s, UpdateLink %v; want the link, unchanged", w.Code, w.Body, env.shortener.update)
	}
	p = shlinkProblemOf(t, env.do("PATCH", "/rest/v3/short-urls/abcd123", `{"validSince":"2030-01-01T00:00:00Z"}`, shlinkGoodKey), 400, "invalid-data")
	if got := strList(p["invalidElements"]); !slices.Equal(got, []string{"validSince"}) {
		t.Errorf("PATCH of validSince: %v", p)
	}
	shlinkProblemOf(t, env.do("PATCH", "/rest/v3/short-urls/zzzz999", `{"tags":[]}`, shlinkGoodKey), 404, "short-url-not-found")

	w = env.do("DELETE", "/rest/v3/short-urls/abcd123", "", shlinkGoodKey)
	if w.Code != 204 || w.Body.Len() != 0 || len(env.shortener.deleted) != 1 {
		t.Errorf("DELETE: %d %q, DeleteLink %v; want 204 without a body", w.Code, w.Body, env.shortener.deleted)
	}
	shlinkProblemOf(t, env.do("DELETE", "/rest/v3/short-urls/zzzz999", "", shlinkGoodKey), 404, "short-url-not-found")
}

// The list pages through the caller's links as Shlink's page and
// itemsPerPage say, reading the links up to the end of the page;
// pagesCount and totalItems are exact on the last page, and one more page
// and link while there are more; the links carry their visitsSummary,
// from one GetLinksClickCounts call a page with links. One
// tags[] is ListLinks's tag; the filters kurz cannot apply are refused by
// name, and so is a page deeper than it reads.
func TestShlinkListPages(t *testing.T) {
	var links []*shortenerv1.Link
	for i := range 25 {
		tags := []string{}
		if i%5 == 0 {
			tags = []string{"five"}
		}
		links = append(links, shlinkLink(fmt.Sprintf("code%03d", i), tags...))
	}
	env := newShlinkEnv(t, links...)
	for _, tc := range []struct {
		query      string
		codes      []string
		pagination string
	}{
		{"", []string{"code000", "code001", "code002", "code003", "code004", "code005", "code006", "code007", "code008", "code009"},
			"map[currentPage:1 itemsInCurrentPage:10 itemsPerPage:10 pagesCount:2 totalItems:11]"},
		{"?page=2&itemsPerPage=10", []string{"code010", "code011", "code012", "code013", "code014", "code015", "code016", "code017", "code018", "code019"},
			"map[currentPage:2 itemsInCurrentPage:10 itemsPerPage:10 pagesCount:3 totalItems:21]"},
		{"?page=3", []string{"code020", "code021", "code022", "code023", "code024"},
			"map[currentPage:3 itemsInCurrentPage:5 itemsPerPage:10 pagesCount:3 totalItems:25]"},
		{"?page=9&itemsPerPage=4", []string{},
			"map[currentPage:9 itemsInCurrentPage:0 itemsPerPage:4 pagesCount:7 totalItems:25]"},
		{"?tags[]=five&itemsPerPage=5&tagsMode=all&orderBy=dateCreated-DESC&excludeMaxVisitsReached=false", []string{"code000", "code005", "code010", "code015", "code020"},
			"map[currentPage:1 itemsInCurrentPage:5 itemsPerPage:5 pagesCount:1 totalItems:5]"},
	} {
		env.analytics.batches = nil
		w := env.do("GET", "/rest/v3/short-urls"+tc.query, "", shlinkGoodKey)
		m := object(t, w)
		list, _ := m["shortUrls"].(map[string]any)
		data, _ := list["data"].([]any)
		var codes []string
		for _, d := range data {
			u := d.(map[string]any)
			codes = append(codes, u["shortCode"].(string))
			if v := fmt.Sprint(u["visitsSummary"]); v != "map[bots:2 nonBots:5 total:7]" {
				t.Errorf("%s: %s has visitsSummary %s, want analytics' counts", tc.query, u["shortCode"], v)
			}
		}
		if want := min(len(codes), 1); len(env.analytics.batches) != want {
			t.Errorf("%s: %d GetLinksClickCounts calls for %d links, want %d", tc.query, len(env.analytics.batches), len(codes), want)
		}
		if w.Code != 200 || !slices.Equal(codes, tc.codes) || fmt.Sprint(list["pagination"]) != tc.pagination {
			t.Errorf("GET %s: %d codes %v pagination %v; want %v %s", tc.query, w.Code, codes, list["pagination"], tc.codes, tc.pagination)
		}
	}
	if got := env.shortener.lists[len(env.shortener.lists)-1]; got.GetTag() != "five" || got.GetPageSize() != 5 {
		t.Errorf("ListLinks %v, want tag five, 5 a page", got)
	}

	env.shortener.lists = nil
	w := env.do("GET", "/rest/v3/short-urls?page=2&itemsPerPage=10", "", shlinkGoodKey)
	if l := env.shortener.lists; w.Code != 200 || len(l) != 1 || l[0].GetPageSize() != 20 || l[0].GetPageToken() != "" {
		t.Errorf("page 2 of 10: %d, ListLinks %v; want the first 20 links read in one call, the first 10 dropped", w.Code, l)
	}
	for _, tc := range []struct{ query, field string }{
		{"?searchTerm=news", "searchTerm"},
		{"?tags[]=a&tags[]=b", "tags"},
		{"?orderBy=visits-DESC", "orderBy"},
		{"?startDate=2026-01-01T00:00:00Z", "startDate"},
		{"?excludePastValidUntil=true", "excludePastValidUntil"},
		{"?domain=go.acme.test", "domain"},
		{"?domain=DEFAULT", "domain"},
		{"?itemsPerPage=-1", "itemsPerPage"},
		{"?itemsPerPage=1001", "itemsPerPage"},
		{"?page=0", "page"},
		{"?page=12&itemsPerPage=1000", "page"},
		{"?page=1&page=2", "page"},
	} {
		p := shlinkProblemOf(t, env.do("GET", "/rest/v3/short-urls"+tc.query, "", shlinkGoodKey), 400, "invalid-data")
		if got := strList(p["invalidElements"]); !slices.Equal(got, []string{tc.field}) {
			t.Errorf("GET %s: invalidElements %v, want [%s]", tc.query, got, tc.field)
		}
	}
}

// A page past the first 1,000 links is reached by reading the links
// before it in pages of 1,000, and a page beyond the last answers no
// links with the exact counts.
func TestShlinkListPagesDeep(t *testing.T) {
	var links []*shortenerv1.Link
	for i := range 2500 {
		links = append(links, shlinkLink(fmt.Sprintf("code%04d", i)))
	}
	env := newShlinkEnv(t, links...)
	w := env.do("GET", "/rest/v3/short-urls?page=3&itemsPerPage=1000", "", shlinkGoodKey)
	codes, p := shlinkListPage(t, w)
	var tokens []string
	for _, l := range env.shortener.lists {
		tokens = append(tokens, fmt.Sprintf("%d@%s", l.GetPageSize(), l.GetPageToken()))
	}
	want := shlinkPagination{CurrentPage: 3, PagesCount: 3, ItemsPerPage: 1000, ItemsInCurrentPage: 500, TotalItems: 2500}
	if w.Code != 200 || len(codes) != 500 || codes[0] != "code2000" || p != want || !slices.Equal(tokens, []string{"1000@", "1000@1000", "1000@2000"}) {
		t.Errorf("page 3 of 1000: %d, %d links from %v, %+v, ListLinks %v", w.Code, len(codes), codes[:min(1, len(codes))], p, tokens)
	}

	env.shortener.lists = nil
	w = env.do("GET", "/rest/v3/short-urls?page=5&itemsPerPage=1000", "", shlinkGoodKey)
	if m := object(t, w); w.Code != 200 || len(env.shortener.lists) != 3 ||
		fmt.Sprint(m["shortUrls"]) != "map[data:[] pagination:map[currentPage:5 itemsInCurrentPage:0 itemsPerPage:1000 pagesCount:3 totalItems:2500]]" {
		t.Errorf("page 5 of 1000: %d %v, %d ListLinks calls; want no links, the exact counts, and the listing read to its end once", w.Code, m, len(env.shortener.lists))
	}
}

// A list costs what reading its links through GET /v1/links would: one
// charge of GET /v1/links per 1,000 links read up to the end of its page,
// asked before any is read, and one more for each call the shortener ends
// early (its pages of links past 1 MiB); its visitsSummary one charge of
// the stats route per 100 links of the page, as POST /v1/links:clickCounts
// is charged. A deep page a key cannot pay for reads nothing.
func TestShlinkListIsChargedForTheLinksItReads(t *testing.T) {
	var links []*shortenerv1.Link
	for i := range 2500 {
		links = append(links, shlinkLink(fmt.Sprintf("code%04d", i)))
	}
	env := newShlinkEnv(t, links...)
	for _, tc := range []struct {
		query               string
		cut, charged, stats int
	}{
		{"?itemsPerPage=10", 0, 1, 1},
		{"?page=2&itemsPerPage=600", 0, 2, 6},
		{"?page=3&itemsPerPage=1000", 0, 3, 5},
		{"?itemsPerPage=1000", 400, 3, 10},
	} {
		env.shortener.lists, env.shortener.cut = nil, tc.cut
		w := env.do("GET", "/rest/v3/short-urls"+tc.query, "", shlinkGoodKey)
		got := env.limiter.takeCharged()
		want := append(slices.Repeat([]string{"GET /v1/links"}, tc.charged), slices.Repeat([]string{statsRoute}, tc.stats)...)
		if w.Code != 200 || !slices.Equal(got, want) {
			t.Errorf("GET %s (pages cut at %d): %d, %d ListLinks calls, charged %v; want %v", tc.query, tc.cut, w.Code, len(env.shortener.lists), got, want)
		}
	}

	env.shortener.lists, env.shortener.cut, env.limiter.denyAbove = nil, 0, 1
	w := env.do("GET", "/rest/v3/short-urls?page=3&itemsPerPage=1000", "", shlinkGoodKey)
	if shlinkProblemOf(t, w, 429, "https://kurz.dev/problems/resource-exhausted"); len(env.shortener.lists) != 0 {
		t.Errorf("a page of 3 charges the key cannot pay now: %d ListLinks calls; want none", len(env.shortener.lists))
	}
	// A cost no wait pays (the rule holds less) is no 429 to retry forever.
	env.limiter.capacity = true
	p := shlinkProblemOf(t, env.do("GET", "/rest/v3/short-urls?page=3&itemsPerPage=1000", "", shlinkGoodKey), 400, "invalid-data")
	if got := strList(p["invalidElements"]); !slices.Equal(got, []string{"page"}) || len(env.shortener.lists) != 0 {
		t.Errorf("a page of 3 charges past what the rule holds: %v, %d ListLinks calls; want invalid-data naming page, none", p, len(env.shortener.lists))
	}
}

// shlinkListPage decodes a list answer: its codes and its pagination.
func shlinkListPage(t *testing.T, w *httptest.ResponseRecorder) ([]string, shlinkPagination) {
	t.Helper()
	var out struct {
		ShortURLs struct {
			Data       []shlinkURL      `json:"data"`
			Pagination shlinkPagination `json:"pagination"`
		} `json:"shortUrls"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatalf("%d: not a list: %v\n%s", w.Code, err, w.Body)
	}
	codes := []string{}
	for _, u := range out.ShortURLs.Data {
		codes = append(codes, u.ShortCode)
	}
	return codes, out.ShortURLs.Pagination
}

// The shortener ends a ListLinks page early when its links pass 1 MiB; a
// Shlink page goes on reading past such a cut, so that the pages a client
// asks one by one hold every link, none skipped between two of them.
func TestShlinkListReadsAPageWholeAcrossShortReads(t *testing.T) {
	var links []*shortenerv1.Link
	for i := range 25 {
		links = append(links, shlinkLink(fmt.Sprintf("code%03d", i)))
	}
	env := newShlinkEnv(t, links...)
	env.shortener.cut = 4
	var got []string
	for page := 1; page <= 3; page++ {
		w := env.do("GET", fmt.Sprintf("/rest/v3/short-urls?page=%d&itemsPerPage=10", page), "", shlinkGoodKey)
		codes, p := shlinkListPage(t, w)
		if want := min(10, 25-(page-1)*10); w.Code != 200 || len(codes) != want || p.ItemsInCurrentPage != want {
			t.Errorf("page %d of 10, the shortener's pages cut at 4: %d, %d links %v, %+v; want %d", page, w.Code, len(codes), codes, p, want)
		}
		got = append(got, codes...)
	}
	var want []string
	for _, l := range links {
		want = append(want, l.GetCode())
	}
	if !slices.Equal(got, want) {
		t.Errorf("pages 1 to 3 held %v\nwant every link once, in order: %v", got, want)
	}
}

// A page's links are bounded as ListLinks bounds its page (1 MiB): a page
// of links too large for it is refused, naming itemsPerPage, rather than
// answered short or held whole in memory; a smaller page of them is
// answered.
func TestShlinkListBoundsAPagesBytes(t *testing.T) {
	var links []*shortenerv1.Link
	for i := range 6 {
		l := shlinkLink(fmt.Sprintf("code%03d", i))
		l.LongUrl = "https://example.com/" + strings.Repeat("a", 300<<10)
		links = append(links, l)
	}
	env := newShlinkEnv(t, links...)
	w := env.do("GET", "/rest/v3/short-urls?itemsPerPage=4", "", shlinkGoodKey)
	if p := object(t, w); w.Code != 400 || p["type"] != shlinkProblemType+"invalid-data" ||
		!slices.Equal(strList(p["invalidElements"]), []string{"itemsPerPage"}) {
		t.Errorf("a page of 4 links of 300 KiB: %d, %d bytes (%.200s); want 400 invalid-data naming itemsPerPage", w.Code, w.Body.Len(), w.Body)
	}
	w = env.do("GET", "/rest/v3/short-urls?page=2&itemsPerPage=3", "", shlinkGoodKey)
	if codes, _ := shlinkListPage(t, w); w.Code != 200 || !slices.Equal(codes, []string{"code003", "code004", "code005"}) {
		t.Errorf("page 2 of 3 links of 300 KiB: %d %v; want the last 3", w.Code, codes)
	}
}

// GET /rest/v3/domains (and /rest/v2, the same) lists the default domain
// first, named by the host of its short URLs, then the caller's verified
// custom domains: not one still waiting for its DNS check (it takes no
// links), nor another tenant's. kurz has no not-found redirects per
// domain, so every redirect is null, as Shlink writes one not set. Each
// call is charged once as GET /v1/domains; a call without a valid key
// (or of a suspended tenant) is refused in Shlink's problem shape before
// the shortener is asked.
func TestShlinkListsDomains(t *testing.T) {
	env := newShlinkEnv(t)
	verified := timestamppb.New(shlinkCreated)
	env.shortener.domains = map[string][]*shortenerv1.Domain{
		"acme": {
			{Name: "go.acme.test", Tenant: "acme", Verified: true, VerifyTime: verified},
			{Name: "pending.acme.test", Tenant: "acme"},
			{Name: "to.acme.test", Tenant: "acme", Verified: true, VerifyTime: verified},
		},
		"rival": {{Name: "go.rival.test", Tenant: "rival", Verified: true, VerifyTime: verified}},
	}
	noRedirects := map[string]any{"baseUrlRedirect": nil, "regular404Redirect": nil, "invalidShortUrlRedirect": nil}
	domain := func(name string, isDefault bool) map[string]any {
		return map[string]any{"domain": name, "isDefault": isDefault, "redirects": noRedirects}
	}
	want, err := json.Marshal(map[string]any{"domains": map[string]any{
		"data":             []any{domain(shlinkDefaultDomain, true), domain("go.acme.test", false), domain("to.acme.test", false)},
		"defaultRedirects": noRedirects,
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, version := range []string{"v3", "v2"} {
		w := env.do("GET", "/rest/"+version+"/domains", "", shlinkGoodKey)
		got, err := json.Marshal(object(t, w))
		if err != nil {
			t.Fatal(err)
		}
		if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" || string(got) != string(want) {
			t.Errorf("GET /rest/%s/domains: %d %s %s\nwant 200 application/json %s", version, w.Code, w.Header().Get("Content-Type"), got, want)
		}
		if w.Header().Get("Access-Control-Allow-Origin") != "*" {
			t.Errorf("GET /rest/%s/domains: Access-Control-Allow-Origin %q, want *", version, w.Header().Get("Access-Control-Allow-Origin"))
		}
	}
	if got := env.limiter.takeCharged(); !slices.Equal(got, []string{"GET /v1/domains", "GET /v1/domains"}) {
		t.Errorf("two domain lists charged %v, want GET /v1/domains twice", got)
	}

	lists := env.shortener.domainLists
	shlinkProblemOf(t, env.do("GET", "/rest/v3/domains", "", ""), 401, "missing-authentication")
	shlinkProblemOf(t, env.do("GET", "/rest/v3/domains", "", "kurz_k9_wrong"), 401, "invalid-api-key")
	shlinkProblemOf(t, env.do("GET", "/rest/v3/domains", "", shlinkSuspendedKey), 403, "https://kurz.dev/problems/permission-denied")
	if env.shortener.domainLists != lists {
		t.Errorf("refused calls listed domains %d times, want none", env.shortener.domainLists-lists)
	}
}

// GET /rest/health (and /rest/v3/health) answers Shlink's health, pass
// while the gateway is ready and fail (503) when not, with kurz's version,
// without a key and without charging anything; a version kurz does not
// answer is Shlink's not-found, not repeated.
func TestShlinkHealth(t *testing.T) {
	env := newShlinkEnv(t)
	for _, path := range []string{"/rest/health", "/rest/v3/health", "/rest/v2/health"} {
		w := env.do("GET", path, "", "")
		if m := object(t, w); w.Code != 200 || w.Header().Get("Content-Type") != "application/health+json" || m["status"] != "pass" || m["version"] == "" {
			t.Errorf("GET %s: %d %s %s", path, w.Code, w.Header().Get("Content-Type"), w.Body)
		}
	}
	env.ready = false
	if w := env.do("GET", "/rest/health", "", ""); w.Code != 503 || object(t, w)["status"] != "fail" {
		t.Errorf("GET /rest/health, not ready: %d %s; want 503 fail", w.Code, w.Body)
	}
	w := env.do("GET", "/rest/v1234567/health", "", "")
	if shlinkProblemOf(t, w, 404, "not-found"); strings.Contains(w.Body.String(), "1234567") {
		t.Errorf("the version was repeated: %s", w.Body)
	}
	if got := env.limiter.takeCharged(); len(got) != 0 {
		t.Errorf("health charged %v, want nothing", got)
	}
}

// A Shlink call kurz does not serve (tags, domains, visits overviews,
// redirect rules, Mercure) is Shlink's not-found, as Shlink answers a
// route it does not have, so that its clients read it as such, saying
// what kurz serves; with or without a key, nothing charged.
func TestShlinkCallsNotServedAreShlinksNotFound(t *testing.T) {
	env := newShlinkEnv(t, shlinkLink("abcd123"))
	for _, target := range []string{"/rest/v3/tags", "/rest/v3/domains/redirects", "/rest/v3/visits", "/rest/v3/mercure-info",
		"/rest/v3/short-urls/abcd123/redirect-rules", "/rest/v2/tags/stats"} {
		for _, key := range []string{shlinkGoodKey, ""} {
			w := env.do("GET", target, "", key)
			if p := shlinkProblemOf(t, w, 404, "not-found"); !strings.Contains(p["detail"].(string), "/rest/v3/short-urls") {
				t.Errorf("GET %s: detail %q; want what kurz serves named", target, p["detail"])
			}
		}
	}
	if got := env.limiter.takeCharged(); len(got) != 0 {
		t.Errorf("calls not served charged %v, want nothing", got)
	}
}

// Shlink's web client runs in a browser, on another origin than the
// server it calls (app.shlink.io, or a host of its own), and Shlink
// answers CORS for it: the gateway does too, on /rest/ only. A preflight
// is answered 204 without a key and without charging anything; every
// answer under /rest/, refusals included, lets any origin read it, with
// the RateLimit fields, Retry-After and X-Request-ID exposed. No origin
// is given credentials: the key is the credential, sent by the page that
// holds it. kurz's own API answers no CORS.
func TestShlinkAnswersCORS(t *testing.T) {
	env := newShlinkEnv(t, shlinkLink("abcd123"))
	const origin = "https://app.shlink.io"
	w := env.do("OPTIONS", "/rest/v3/short-urls/abcd123", "", "", "Origin", origin,
		"Access-Control-Request-Method", "PATCH", "Access-Control-Request-Headers", "content-type,x-api-key")
	h := w.Header()
	if w.Code != 204 || h.Get("Access-Control-Allow-Origin") != "*" || !strings.Contains(h.Get("Access-Control-Allow-Methods"), "PATCH") ||
		!strings.Contains(h.Get("Access-Control-Allow-Headers"), "X-Api-Key") || !strings.Contains(h.Get("Access-Control-Allow-Headers"), "Content-Type") ||
		h.Get("Access-Control-Allow-Credentials") != "" || h.Get("Access-Control-Max-Age") == "" {
		t.Errorf("preflight: %d %v; want 204 letting any origin PATCH with X-Api-Key and Content-Type, without credentials", w.Code, h)
	}
	if got := env.limiter.takeCharged(); len(got) != 0 || env.limiter.authFailures != 0 {
		t.Errorf("the preflight charged %v and counted %d failed authentications; want none", got, env.limiter.authFailures)
	}

	for _, tc := range []struct {
		target, key string
		status      int
	}{
		{"/rest/v3/short-urls/abcd123", shlinkGoodKey, 200},
		{"/rest/v3/short-urls/abcd123", "", 401},
		{"/rest/v3/tags", shlinkGoodKey, 404},
		{"/rest/health", "", 200},
	} {
		w := env.do("GET", tc.target, "", tc.key, "Origin", origin)
		exposed := w.Header().Get("Access-Control-Expose-Headers")
		if w.Code != tc.status || w.Header().Get("Access-Control-Allow-Origin") != "*" ||
			!strings.Contains(exposed, "RateLimit") || !strings.Contains(exposed, "Retry-After") || !strings.Contains(exposed, "X-Request-ID") {
			t.Errorf("GET %s from %s: %d, Allow-Origin %q, Expose-Headers %q; want %d readable by any origin, its fields exposed",
				tc.target, origin, w.Code, w.Header().Get("Access-Control-Allow-Origin"), exposed, tc.status)
		}
	}

	w = env.do("OPTIONS", "/rest/v3/short-urls", "", "")
	if w.Code != 405 || w.Header().Get("Allow") == "" {
		t.Errorf("OPTIONS without a preflight's fields: %d, Allow %q; want 405 with the methods allowed", w.Code, w.Header().Get("Allow"))
	}
	w = env.do("OPTIONS", "/v1/links", "", "", "Origin", origin, "Access-Control-Request-Method", "POST")
	if w.Code != 405 || w.Header().Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("a preflight of kurz's own API: %d, Allow-Origin %q; want 405 without CORS", w.Code, w.Header().Get("Access-Control-Allow-Origin"))
	}
}

// A list's page carries each link's visitsSummary from one
// GetLinksClickCounts call naming every link of the page (its domain
// with it), counted since the page's oldest link was made, and is charged
// once more as GET /v1/links/{code}/stats, whatever its size. When the
// statistics cannot be had, or their charge is refused, the page is
// answered all the same, its links without visitsSummary.
func TestShlinkListVisitsFromOneCall(t *testing.T) {
	const stats = "GET /v1/links/{code}/stats"
	older := shlinkLink("old1234")
	older.CreateTime = timestamppb.New(shlinkCreated.Add(-48 * time.Hour))
	d := "go.acme.test"
	onDomain := shlinkLink("dom1234")
	onDomain.Domain = &d
	env := newShlinkEnv(t, shlinkLink("new1234"), onDomain, older)
	env.analytics.byCode = map[string]*analyticsv1.ClickCounts{
		"old1234": {Total: 3, Human: 3},
		"dom1234": {Total: 9, Human: 1, Bot: 8},
	}
	w := env.do("GET", "/rest/v3/short-urls", "", shlinkGoodKey)
	visits := map[string]string{}
	for _, u := range object(t, w)["shortUrls"].(map[string]any)["data"].([]any) {
		u := u.(map[string]any)
		visits[u["shortCode"].(string)] = fmt.Sprint(u["visitsSummary"])
	}
	want := map[string]string{"new1234": "map[bots:2 nonBots:5 total:7]", "dom1234": "map[bots:8 nonBots:1 total:9]",
		"old1234": "map[bots:0 nonBots:3 total:3]"}
	if w.Code != 200 || !maps.Equal(visits, want) {
		t.Errorf("list: %d visits %v, want %v", w.Code, visits, want)
	}
	if got := env.limiter.takeCharged(); !slices.Equal(got, []string{"GET /v1/links", stats}) {
		t.Errorf("charged %v, want the list and one statistics call", got)
	}
	if b := env.analytics.batches; len(b) != 1 || len(env.analytics.asked) != 0 {
		t.Fatalf("%d GetLinksClickCounts and %d GetLinkStats calls, want one batch call", len(b), len(env.analytics.asked))
	}
	b := env.analytics.batches[0]
	var named []string
	for _, l := range b.GetLinks() {
		named = append(named, linkdomain.Key(l.GetDomain(), l.GetCode()))
	}
	if !slices.Equal(named, []string{"new1234", "go.acme.test/dom1234", "old1234"}) || !b.GetStartTime().AsTime().Equal(older.GetCreateTime().AsTime()) {
		t.Errorf("counts asked for %v since %v, want the page's links since the oldest was made (%v)", named, b.GetStartTime().AsTime(), older.GetCreateTime().AsTime())
	}

	for name, breakIt := range map[string]func(){
		"analytics down":          func() { env.analytics.err = rpcerr.WithDetails(codes.Unavailable, "analytics is down") },
		"the stats route refused": func() { env.limiter.denyRoute = stats },
	} {
		env.analytics.err, env.limiter.denyRoute, env.analytics.batches = nil, "", nil
		breakIt()
		w := env.do("GET", "/rest/v3/short-urls", "", shlinkGoodKey)
		codes, _ := shlinkListPage(t, w)
		if w.Code != 200 || len(codes) != 3 || strings.Contains(w.Body.String(), "visitsSummary") {
			t.Errorf("%s: %d %s; want the 3 links without visitsSummary", name, w.Code, w.Body)
		}
		if wantCalls := map[bool]int{true: 1, false: 0}[env.limiter.denyRoute == ""]; len(env.analytics.batches) != wantCalls {
			t.Errorf("%s: %d GetLinksClickCounts calls, want %d", name, len(env.analytics.batches), wantCalls)
		}
		env.limiter.takeCharged()
	}
}

// A turn in a leaky bucket's queue further off than the gateway waits is
// a 429 at once, retrying at that turn: each request waiting holds a
// goroutine and a connection, and a queue keyed on what a client varies
// would let it park as many as it likes. (The request's deadline only
// ends a gateway that waits anyway; nothing is timed.)
func TestQueueTurnTooFarOffIsRefused(t *testing.T) {
	env := newShlinkEnv(t, shlinkLink("far"))
	env.limiter.delay = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := httptest.NewRequestWithContext(ctx, "GET", "/rest/v3/short-urls/far", nil)
	r.Header.Set("X-Api-Key", shlinkGoodKey)
	w := httptest.NewRecorder()
	env.handler.ServeHTTP(w, r)
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "3600" {
		t.Fatalf("a turn an hour off: %d, Retry-After %q; want 429 and 3600 (body %.300s)", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
	if got := env.shortener.gets; len(got) != 0 {
		t.Errorf("the shortener was asked %d times for a refused request", len(got))
	}
}

// While analytics is older than the gateway (a rolling upgrade), it
// answers GetLinksClickCounts UNIMPLEMENTED: every list page is answered
// without visitsSummary, and the log says so once for the many pages, not
// a warning a page.
func TestShlinkListAgainstAnOlderAnalytics(t *testing.T) {
	env := newShlinkEnv(t, shlinkLink("new1234"), shlinkLink("old1234"))
	env.analytics.err = status.Error(codes.Unimplemented, "unknown method GetLinksClickCounts for service kurz.analytics.v1.AnalyticsService")
	for range 5 {
		w := env.do("GET", "/rest/v3/short-urls", "", shlinkGoodKey)
		if codes, _ := shlinkListPage(t, w); w.Code != 200 || len(codes) != 2 || strings.Contains(w.Body.String(), "visitsSummary") {
			t.Fatalf("%d %s; want the 2 links without visitsSummary", w.Code, w.Body)
		}
	}
	logs := env.logs.String()
	if n := strings.Count(logs, "level=WARN"); n != 1 || !strings.Contains(logs, "GetLinksClickCounts") {
		t.Errorf("%d warnings for 5 pages, want 1 naming GetLinksClickCounts:\n%s", n, logs)
	}
}

// A link stamped ahead of the gateway's clock (the shortener's host runs
// ahead) is counted from before now, on its own as in a list: a range
// ending before it starts is one analytics refuses, and one link's
// visitsSummary would be left out where the list has it.
func TestShlinkVisitsOfALinkStampedAheadOfTheClock(t *testing.T) {
	ahead := shlinkLink("ahead12")
	ahead.CreateTime = timestamppb.New(time.Now().Add(time.Minute))
	env := newShlinkEnv(t, ahead)
	env.do("GET", "/rest/v3/short-urls/ahead12", "", shlinkGoodKey)
	env.do("GET", "/rest/v3/short-urls", "", shlinkGoodKey)
	if len(env.analytics.asked) != 1 || len(env.analytics.batches) != 1 {
		t.Fatalf("%d GetLinkStats and %d GetLinksClickCounts calls, want one of each", len(env.analytics.asked), len(env.analytics.batches))
	}
	for name, r := range map[string]interface {
		GetStartTime() *timestamppb.Timestamp
		GetEndTime() *timestamppb.Timestamp
	}{"one link": env.analytics.asked[0], "the list": env.analytics.batches[0]} {
		if start, end := r.GetStartTime().AsTime(), r.GetEndTime().AsTime(); !start.Before(end) {
			t.Errorf("%s: counted from %v to %v, want a range that starts before it ends", name, start, end)
		}
	}
}

// A Shlink answer charged to two rules (the list or the link's route, and
// the stats route for its visitsSummary) carries the RateLimit fields of
// the stricter, the one with less left for its limit, as the limiter's
// answer tells of its rule with the least headroom: the stats charge's
// fields, written last, must not hide a list rule nearly spent, nor the
// list's a stats rule nearly spent.
func TestShlinkVisitsAnswerTheStricterRateLimit(t *testing.T) {
	const stats = "GET /v1/links/{code}/stats"
	env := newShlinkEnv(t, shlinkLink("abcd123"))
	rule := func(name string, limit, remaining int64) *ratelimitv1.CheckQuotaResponse {
		return &ratelimitv1.CheckQuotaResponse{Allowed: true, DecidingRule: name, Limit: limit, Remaining: remaining,
			Decisions: []*ratelimitv1.RuleDecision{{Rule: name, Allowed: true, Window: durationpb.New(time.Minute)}}}
	}
	for _, tc := range []struct {
		name        string
		route, stat *ratelimitv1.CheckQuotaResponse
		want        string
	}{
		{"the stats rule nearly spent", rule("list", 600, 500), rule("stats", 20, 2), `"api/stats";r=2`},
		{"the list rule nearly spent", rule("list", 600, 6), rule("stats", 20, 19), `"api/list";r=6`},
	} {
		for _, target := range []string{"/rest/v3/short-urls", "/rest/v3/short-urls/abcd123"} {
			route := map[bool]string{true: "GET /v1/links", false: "GET /v1/links/{code}"}[target == "/rest/v3/short-urls"]
			env.limiter.byRoute = map[string]*ratelimitv1.CheckQuotaResponse{route: tc.route, stats: tc.stat}
			w := env.do("GET", target, "", shlinkGoodKey)
			if got := w.Header()["RateLimit"]; w.Code != 200 || len(got) != 1 || !strings.HasPrefix(got[0], tc.want) ||
				!strings.Contains(w.Body.String(), "visitsSummary") {
				t.Errorf("%s, GET %s: %d, RateLimit %q; want 200 with visitsSummary, RateLimit %s…", tc.name, target, w.Code, got, tc.want)
			}
			if got := env.limiter.takeCharged(); !slices.Equal(got, []string{route, stats}) {
				t.Errorf("%s, GET %s: charged %v, want %s and the stats route", tc.name, target, got, route)
			}
		}
	}
}

// The stats charge pays for counts analytics answers: once the gateway
// knows analytics answers GetLinksClickCounts UNIMPLEMENTED (an older
// analytics, a rolling upgrade), a list page asks it first and takes no
// charge for counts it did not get; only the page that learned it was
// charged (the charge precedes the call, and cannot be refunded). Once
// analytics answers again, the page is charged for its counts (left out
// when that charge is refused), and the pages after are charged before
// analytics is asked, so that a refused charge spares analytics the work.
func TestShlinkListAgainstAnOlderAnalyticsIsNotChargedForCounts(t *testing.T) {
	const stats = "GET /v1/links/{code}/stats"
	env := newShlinkEnv(t, shlinkLink("new1234"), shlinkLink("old1234"))
	env.analytics.err = status.Error(codes.Unimplemented, "unknown method GetLinksClickCounts for service kurz.analytics.v1.AnalyticsService")
	list := func(step string, wantCharged []string, wantSummary bool, wantAsked int) {
		t.Helper()
		env.analytics.batches = nil
		w := env.do("GET", "/rest/v3/short-urls", "", shlinkGoodKey)
		if codes, _ := shlinkListPage(t, w); w.Code != 200 || len(codes) != 2 || strings.Contains(w.Body.String(), "visitsSummary") != wantSummary {
			t.Errorf("%s: %d %s; want the 2 links, visitsSummary %v", step, w.Code, w.Body, wantSummary)
		}
		if got := env.limiter.takeCharged(); !slices.Equal(got, wantCharged) {
			t.Errorf("%s: charged %v, want %v", step, got, wantCharged)
		}
		if n := len(env.analytics.batches); n != wantAsked {
			t.Errorf("%s: analytics asked %d times, want %d", step, n, wantAsked)
		}
	}
	list("the page that learns analytics is older", []string{"GET /v1/links", stats}, false, 1)
	for range 3 {
		list("a page once it is known", []string{"GET /v1/links"}, false, 1)
	}

	env.analytics.err = nil
	env.limiter.denyRoute = stats
	list("analytics upgraded, the stats charge refused", []string{"GET /v1/links"}, false, 1)
	env.limiter.denyRoute = ""
	list("analytics upgraded", []string{"GET /v1/links", stats}, true, 1)
	env.limiter.denyRoute = stats
	list("the next page, its stats charge refused", []string{"GET /v1/links"}, false, 0)
}
