package httpapi

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/capacity"
	"kurz.dev/pkg/linkimport"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/rpcerr"
)

// bulkShortener is a fake shortener for the bulk routes: ListLinks pages
// through links (pageSize of them per page, failing at page failPage),
// BatchCreateLinks gives each valid item the code "c<n>" (or its alias),
// refusing URLs without "://" and failing call failBatch.
type bulkShortener struct {
	shortenerv1.ShortenerServiceClient
	links     []*shortenerv1.Link
	pageSize  int
	failPage  int
	lists     []*shortenerv1.ListLinksRequest
	batches   [][]*shortenerv1.CreateLinkRequest
	failBatch int
	batchErr  error
	// failAfterCommit makes batch failBatch create its links, then fail
	// (a call that timed out after the shortener committed).
	failAfterCommit bool
	update          *shortenerv1.UpdateLinkRequest
	// taken aliases are ALREADY_EXISTS; those of mine are the caller's
	// links (GetLink finds them), the others another tenant's.
	taken map[string]string // alias: its link's URL
	mine  map[string]bool
	gets  int // GetLink calls
}

func (s *bulkShortener) GetLink(_ context.Context, in *shortenerv1.GetLinkRequest, _ ...grpc.CallOption) (*shortenerv1.GetLinkResponse, error) {
	s.gets++
	if u, ok := s.taken[in.GetCode()]; ok && s.mine[in.GetCode()] {
		return &shortenerv1.GetLinkResponse{Link: &shortenerv1.Link{Code: in.GetCode(), ShortUrl: "http://k.test/" + in.GetCode(), LongUrl: u}}, nil
	}
	return nil, status.Error(codes.NotFound, "no such link")
}

func (s *bulkShortener) ListLinks(_ context.Context, in *shortenerv1.ListLinksRequest, _ ...grpc.CallOption) (*shortenerv1.ListLinksResponse, error) {
	s.lists = append(s.lists, proto.Clone(in).(*shortenerv1.ListLinksRequest))
	if len(s.lists) == s.failPage {
		return nil, status.Error(codes.Unavailable, "connection refused to 10.0.0.7")
	}
	start := 0
	if in.GetPageToken() != "" {
		fmt.Sscan(in.GetPageToken(), &start)
	}
	end := min(start+s.pageSize, len(s.links))
	resp := &shortenerv1.ListLinksResponse{Links: s.links[start:end]}
	if end < len(s.links) {
		resp.NextPageToken = fmt.Sprint(end)
	}
	return resp, nil
}

func (s *bulkShortener) BatchCreateLinks(_ context.Context, in *shortenerv1.BatchCreateLinksRequest, _ ...grpc.CallOption) (*shortenerv1.BatchCreateLinksResponse, error) {
	s.batches = append(s.batches, in.GetRequests())
	if len(s.batches) == s.failBatch && !s.failAfterCommit {
		return nil, s.batchErr
	}
	resp := &shortenerv1.BatchCreateLinksResponse{}
	for i, r := range in.GetRequests() {
		res := &shortenerv1.BatchCreateResult{Index: int32(i)}
		if !strings.Contains(r.GetLongUrl(), "://") {
			res.Error = &shortenerv1.BatchItemError{Code: "INVALID_ARGUMENT", Message: "not a URL", Field: "long_url"}
		} else if _, taken := s.taken[r.GetCustomAlias()]; taken {
			res.Error = &shortenerv1.BatchItemError{Code: "ALREADY_EXISTS", Message: "alias taken", Field: "custom_alias"}
		} else {
			code := r.GetCustomAlias()
			if code == "" {
				code = fmt.Sprintf("c%d", len(s.batches)*10000+i)
			}
			res.Link = &shortenerv1.Link{Code: code, ShortUrl: "http://k.test/" + code, LongUrl: r.GetLongUrl(),
				Password: r.GetPassword(), PasswordProtected: r.GetPassword() != ""}
			res.Created = true
			resp.Created++
		}
		resp.Results = append(resp.Results, res)
	}
	if len(s.batches) == s.failBatch {
		return nil, s.batchErr
	}
	return resp, nil
}

func (s *bulkShortener) UpdateLink(_ context.Context, in *shortenerv1.UpdateLinkRequest, _ ...grpc.CallOption) (*shortenerv1.UpdateLinkResponse, error) {
	s.update = proto.Clone(in).(*shortenerv1.UpdateLinkRequest)
	return &shortenerv1.UpdateLinkResponse{Link: in.GetLink()}, nil
}

// newBulkAPI is an API of sh for the bulk handlers, called past admission
// (bulkCall): a 1 KiB body bound, one bulk slot, and a limiter that allows
// every charge a handler asks itself (an export's later pages, an
// import's later batches).
func newBulkAPI(sh *bulkShortener) *API {
	q, err := quota.New(&shlinkLimiter{}, time.Second, slog.New(slog.DiscardHandler), noop.NewMeterProvider())
	if err != nil {
		panic(err)
	}
	return &API{opts: Options{MaxBodyBytes: 1024, CallTimeout: time.Second}, shortener: sh, log: slog.New(slog.DiscardHandler),
		quota: q, keys: shlinkKeys{}, bulk: capacity.New(1, 0), bulkHeld: map[string]int{}, bulkShare: 1}
}

// bulkCall runs handle on method target with body, as the route table
// would after admission of shlinkGoodKey (tenant acme, key k1).
func bulkCall(a *API, handle func(*call) error, method, target, body string) (*httptest.ResponseRecorder, error) {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	r.SetPathValue("code", "abcd123")
	w := httptest.NewRecorder()
	return w, handle(&call{w: w, r: r, st: &reqState{id: "t", ip: "203.0.113.9", tenant: "acme"}, keyID: "k1", key: shlinkGoodKey})
}

func statusOf(t *testing.T, err error) (int, string) {
	t.Helper()
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = toAPIError(err)
	}
	return ae.status, ae.message
}

// A batch holds 1 to 1,000 items, in a body that may be larger than the
// default bound; the shortener's answer is passed on with 200.
func TestBatchCreateLinks(t *testing.T) {
	item := `{"longUrl":"https://example.com/` + strings.Repeat("p", 200) + `"}`
	items := func(n int) string {
		return `{"requests":[` + strings.TrimSuffix(strings.Repeat(item+",", n), ",") + `]}`
	}
	for name, tc := range map[string]struct {
		body       string
		wantStatus int
		wantText   string
	}{
		"empty list":     {body: `{"requests":[]}`, wantStatus: 400, wantText: `"requests" must hold 1 to 1000 links; it holds 0`},
		"no list":        {body: `{}`, wantStatus: 400, wantText: "it holds 0"},
		"1001 items":     {body: items(1001), wantStatus: 400, wantText: "it holds more than 1000: split larger batches"},
		"unknown field":  {body: `{"requests":[{"longUrl":"x","colour":1}]}`, wantStatus: 400, wantText: "unknown field"},
		"empty body":     {body: ``, wantStatus: 400, wantText: "the request body is empty"},
		"too large":      {body: items(1000) + strings.Repeat(" ", batchBodyBytes), wantStatus: 413},
		"1000 items":     {body: items(1000), wantStatus: 200},
		"one bad of two": {body: `{"requests":[{"longUrl":"https://a.example/"},{"longUrl":"nope"}]}`, wantStatus: 200},
	} {
		t.Run(name, func(t *testing.T) {
			sh := &bulkShortener{}
			a := newBulkAPI(sh)
			w, err := bulkCall(a, a.routeHandler("POST /v1/links:batch"), "POST", "/v1/links:batch", tc.body)
			if err != nil {
				code, msg := statusOf(t, err)
				if code != tc.wantStatus || !strings.Contains(msg, tc.wantText) {
					t.Fatalf("got %d %q, want %d containing %q", code, msg, tc.wantStatus, tc.wantText)
				}
				if len(sh.batches) != 0 {
					t.Errorf("a refused batch reached the shortener")
				}
				return
			}
			if w.Code != tc.wantStatus {
				t.Fatalf("got %d %s, want %d", w.Code, w.Body, tc.wantStatus)
			}
			var resp struct {
				Results []struct {
					Index int             `json:"index"`
					Link  json.RawMessage `json:"link"`
					Error *itemError      `json:"error"`
				} `json:"results"`
				Created int `json:"created"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil {
				t.Fatal(err)
			}
			n := len(sh.batches[0])
			if len(resp.Results) != n {
				t.Fatalf("%d results for %d items", len(resp.Results), n)
			}
			for i, r := range resp.Results {
				if r.Index != i || (r.Link == nil) == (r.Error == nil) {
					t.Errorf("result %d: index %d, link %s, error %v: want its index and one of link or error", i, r.Index, r.Link, r.Error)
				}
			}
			if name == "one bad of two" && (resp.Created != 1 || resp.Results[1].Error.Field != "long_url") {
				t.Errorf("created %d, second error %+v; want 1 and a long_url error", resp.Created, resp.Results[1].Error)
			}
		})
	}
}

// No answer carries a password, even one a service sent by mistake: the
// input-only field is cleared and left out of the JSON, in a single link
// and in the links of a list or batch.
func TestAnswersCarryNoPassword(t *testing.T) {
	link := func() *shortenerv1.Link {
		return &shortenerv1.Link{Code: "abcd123", LongUrl: `https://example.com/?q="password":""`, Password: "hunter22hunter22", PasswordProtected: true}
	}
	for name, m := range map[string]proto.Message{
		"link": link(),
		"list": &shortenerv1.ListLinksResponse{Links: []*shortenerv1.Link{link(), link()}},
		"batch": &shortenerv1.BatchCreateLinksResponse{Results: []*shortenerv1.BatchCreateResult{
			{Index: 0, Link: link()}, {Index: 1, Error: &shortenerv1.BatchItemError{Code: "INVALID_ARGUMENT"}}}},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := (protoMarshaler{}).Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			body := string(out)
			if strings.Contains(body, "hunter22") || strings.Contains(body, `,"password":`) {
				t.Errorf("answer carries the password field: %s", body)
			}
			if !strings.Contains(body, `"passwordProtected":true`) || !strings.Contains(body, `q=\"password\":\"\"`) {
				t.Errorf("answer lost passwordProtected or mangled the URL: %s", body)
			}
			if !json.Valid(out) {
				t.Errorf("invalid JSON: %s", body)
			}
		})
	}
}

// PATCH takes the new fields into the mask: tags, maxVisits, password and
// deviceTargets (null clears them).
func TestUpdateLinkNewFields(t *testing.T) {
	sh := &bulkShortener{}
	a := newBulkAPI(sh)
	body := `{"tags":["a","b"],"maxVisits":"5","password":"correct horse","deviceTargets":null}`
	w, err := bulkCall(a, a.routeHandler("PATCH /v1/links/{code}"), "PATCH", "/v1/links/abcd123", body)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sh.update.GetUpdateMask().GetPaths(), []string{"device_targets", "max_visits", "password", "tags"}; !reflect.DeepEqual(got, want) {
		t.Errorf("mask = %v, want %v", got, want)
	}
	l := sh.update.GetLink()
	if !reflect.DeepEqual(l.GetTags(), []string{"a", "b"}) || l.GetMaxVisits() != 5 || l.GetPassword() != "correct horse" || l.GetDeviceTargets() != nil {
		t.Errorf("link sent = %v", l)
	}
	if strings.Contains(w.Body.String(), "correct horse") {
		t.Errorf("the answer echoes the password: %s", w.Body)
	}
	_, err = bulkCall(a, a.routeHandler("PATCH /v1/links/{code}"), "PATCH", "/v1/links/abcd123", `{"passwordProtected":true}`)
	if code, msg := statusOf(t, err); code != 400 || !strings.Contains(msg, "tags, title, maxVisits, password, deviceTargets, rules and variants") {
		t.Errorf("PATCH passwordProtected: %d %q, want a 400 listing the fields", code, msg)
	}
}

// The export is CSV in pages: the header row, then each link, with the tag
// filter and page tokens passed on, formula-like cells quoted and times in
// UTC with their fractions.
func TestExportLinks(t *testing.T) {
	sh := &bulkShortener{pageSize: 2}
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("CET", 3600))
	for i := range 5 {
		sh.links = append(sh.links, &shortenerv1.Link{Code: fmt.Sprintf("code%03d", i), ShortUrl: "http://k.test/x",
			LongUrl: "https://example.com/" + fmt.Sprint(i), Tags: []string{"a", "b"}, CreateTime: timestamppb.New(created)})
	}
	sh.links[1].LongUrl = "=HYPERLINK(\"http://evil.example\")"
	sh.links[1].Tags = []string{"-x", "y"}
	sh.links[2].MaxVisits = 7
	sh.links[2].PasswordProtected = true
	sh.links[2].Password = "never-exported"
	sh.links[2].ExpireTime = timestamppb.New(created.Add(time.Hour))
	sh.links[3].ExpireTime = timestamppb.New(created.Add(time.Hour + 123456*time.Microsecond)) // kept to the µs
	sh.links[3].DeviceTargets = &shortenerv1.DeviceTargets{IosUrl: "https://apple.example/", AndroidUrl: "@android", DesktopUrl: "https://d.example/"}
	sh.links[4].Domain = proto.String("go.acme.test")
	sh.links[4].ShortUrl = "https://go.acme.test/code004"
	sh.links[4].RedirectType = shortenerv1.RedirectType_REDIRECT_TYPE_MOVED_PERMANENTLY
	sh.links[4].Rules = []*shortenerv1.RedirectRule{{Name: "de", Conditions: []*shortenerv1.RuleCondition{{Languages: []string{"de"}}}, Url: "https://example.com/de"}}
	sh.links[4].Variants = []*shortenerv1.Variant{{Name: "a", Url: "https://example.com/a", Weight: 1}, {Name: "b", Url: "https://example.com/b", Weight: 2}}
	sh.links[0].Title = "Spring sale, \"final\" <b>days</b> ✓"
	sh.links[1].Title = "=cmd|' /C calc'!A0"
	a := newBulkAPI(sh)
	w, err := bulkCall(a, a.exportLinks, "GET", "/v1/links:export?tag=a", "")
	if err != nil {
		t.Fatal(err)
	}
	if ct, cd := w.Header().Get("Content-Type"), w.Header().Get("Content-Disposition"); ct != "text/csv; charset=utf-8" || cd != `attachment; filename="kurz-links.csv"` {
		t.Errorf("Content-Type %q, Content-Disposition %q", ct, cd)
	}
	if len(sh.lists) != 3 || sh.lists[0].GetTag() != "a" || sh.lists[2].GetPageToken() != "4" || sh.lists[0].GetPageSize() != exportPageSize {
		t.Errorf("ListLinks calls = %v", sh.lists)
	}
	body := w.Body.String()
	recs, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		exportColumns,
		{"code000", "http://k.test/x", "https://example.com/0", "a|b", "2026-01-02T02:04:05Z", "", "", "false", "false", "", "", "", "", "", "", "", sh.links[0].Title},
		{"code001", "http://k.test/x", "'=HYPERLINK(\"http://evil.example\")", "'-x|y", "2026-01-02T02:04:05Z", "", "", "false", "false", "", "", "", "", "", "", "", "'=cmd|' /C calc'!A0"},
		{"code002", "http://k.test/x", "https://example.com/2", "a|b", "2026-01-02T02:04:05Z", "2026-01-02T03:04:05Z", "7", "false", "true", "", "", "", "", "", "", "", ""},
		{"code003", "http://k.test/x", "https://example.com/3", "a|b", "2026-01-02T02:04:05Z", "2026-01-02T03:04:05.123456Z", "", "false", "false", "https://apple.example/", "'@android", "https://d.example/", "", "", "", "", ""},
		{"code004", "https://go.acme.test/code004", "https://example.com/4", "a|b", "2026-01-02T02:04:05Z", "", "", "false", "false", "", "", "", "go.acme.test", "301",
			linkimport.JSONList(sh.links[4].Rules), linkimport.JSONList(sh.links[4].Variants), ""},
	}
	if !reflect.DeepEqual(recs, want) {
		t.Errorf("CSV:\n got %q\nwant %q", recs, want)
	}
	// The export imports as the links it lists (the password-protected
	// one fails its row: the export holds no password).
	format, rows, err := linkimport.Parse(strings.NewReader(body))
	if err != nil || format != linkimport.Kurz || len(rows) != 5 || !strings.Contains(rows[2].Problem, "password") {
		t.Fatalf("the export parsed as %q, %d rows, %v", format, len(rows), err)
	}
	for i, l := range sh.links {
		if i == 2 {
			continue
		}
		r := rows[i]
		rules, variants := r.RulesAndVariants()
		got := &shortenerv1.Link{Code: r.SourceCode, LongUrl: r.LongURL, Tags: r.Tags, ExpireTime: r.Link.GetExpireTime(),
			MaxVisits: r.Link.GetMaxVisits(), DeviceTargets: r.Link.GetDeviceTargets(), RedirectType: r.Link.GetRedirectType(),
			Rules: rules, Variants: variants, Title: r.Title}
		if d := r.Link.GetDomain(); d != "" {
			got.Domain = proto.String(d)
		}
		wantLink := proto.CloneOf(l)
		wantLink.ShortUrl, wantLink.CreateTime = "", nil
		wantLink.Tags = []string{"a", "b"}
		if i == 1 {
			wantLink.Tags = []string{"-x", "y"}
		}
		if !proto.Equal(got, wantLink) {
			t.Errorf("link %d after export and parse:\n%v\nwant\n%v", i, got, wantLink)
		}
	}
	if strings.Contains(w.Body.String(), "never-exported") {
		t.Error("the export carries a password")
	}
}

// A refusal of the first page is an ordinary error answer; a failure on a
// later page aborts the response (http.ErrAbortHandler), never a short file
// that looks whole.
func TestExportFailures(t *testing.T) {
	sh := &bulkShortener{pageSize: 1, failPage: 1, links: []*shortenerv1.Link{{Code: "a"}, {Code: "b"}}}
	a := newBulkAPI(sh)
	w, err := bulkCall(a, a.exportLinks, "GET", "/v1/links:export", "")
	if code, msg := statusOf(t, err); code != 503 || strings.Contains(msg, "10.0.0.7") || w.Body.Len() != 0 {
		t.Errorf("first page refused: %d %q, body %q; want a 503 without the internal text and no body", code, msg, w.Body)
	}

	sh = &bulkShortener{pageSize: 1, failPage: 2, links: []*shortenerv1.Link{{Code: "a"}, {Code: "b"}}}
	a = newBulkAPI(sh)
	defer func() {
		if p := recover(); p != http.ErrAbortHandler {
			t.Errorf("a failure mid-way: recovered %v, want http.ErrAbortHandler", p)
		}
	}()
	_, _ = bulkCall(a, a.exportLinks, "GET", "/v1/links:export", "")
	t.Error("a failure mid-way ended the export normally")
}

// exportEnv is the API over the Shlink tests' fakes holding n links, served
// as the gateway serves it, for the export's charges.
func exportEnv(t *testing.T, n int) *shlinkEnv {
	t.Helper()
	links := make([]*shortenerv1.Link, n)
	for i := range links {
		links[i] = shlinkLink(fmt.Sprintf("code%04d", i))
	}
	return newShlinkEnv(t, links...)
}

// exportOf sends GET /v1/links:export with shlinkGoodKey to env's gateway.
func exportOf(t *testing.T, env *shlinkEnv) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest("GET", "/v1/links:export", nil)
	r.Header.Set("Authorization", "Bearer "+shlinkGoodKey)
	w := httptest.NewRecorder()
	env.handler.ServeHTTP(w, r)
	return w
}

// An export is charged as its route once per page of up to 1,000 links,
// each later page before it is read (the admission pays the first), as
// GET /v1/links and the Shlink list are: 2,500 links are three charges,
// where they were one. A refusal that says to come back within a few
// seconds is waited out, the export going on at the key's rate.
func TestExportIsChargedPerPage(t *testing.T) {
	env := exportEnv(t, 2500)
	w := exportOf(t, env)
	recs, err := csv.NewReader(w.Body).ReadAll()
	if w.Code != http.StatusOK || err != nil || len(recs) != 2501 {
		t.Fatalf("export of 2,500 links: %d, %d records (%v); want 200, the header and 2,500 rows", w.Code, len(recs), err)
	}
	if got, want := env.limiter.takeCharged(), slices.Repeat([]string{exportRoute}, 3); !slices.Equal(got, want) || len(env.shortener.lists) != 3 {
		t.Errorf("export of 3 pages: charged %v, %d ListLinks calls; want %v, 3", got, len(env.shortener.lists), want)
	}
	if len(w.Header()["RateLimit"]) != 1 { // as spelt, not canonical
		t.Error("the export's answer has no RateLimit field")
	}

	// The key's rule is empty at page 2 for a second: the page waits.
	env = exportEnv(t, 2500)
	env.limiter.refuse = func(ask int) time.Duration { return map[int]time.Duration{2: time.Second}[ask] }
	start := time.Now()
	w = exportOf(t, env)
	recs, err = csv.NewReader(w.Body).ReadAll()
	if w.Code != http.StatusOK || err != nil || len(recs) != 2501 {
		t.Fatalf("export refused once for a second: %d, %d records (%v); want it whole", w.Code, len(recs), err)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("export refused for a second went on after %v; want it to wait the second", took)
	}
	if got := env.limiter.takeCharged(); len(got) != 3 || env.limiter.asks != 4 {
		t.Errorf("export refused once: %d charges in %d asks; want 3 in 4", len(got), env.limiter.asks)
	}
}

// A page the key's quota refuses ends the export as a failed transfer
// (http.ErrAbortHandler: the chunked body is cut without its last chunk):
// the client's read fails after the pages before it, rather than ending
// on a file that looks whole; nothing more is read from the shortener. So
// does a second refusal after a short wait.
func TestExportRefusedMidwayIsAbortedWhereTheClientSeesIt(t *testing.T) {
	for name, refuse := range map[string]func(ask int) time.Duration{
		"a long wait":             func(ask int) time.Duration { return map[bool]time.Duration{true: time.Minute}[ask >= 2] },
		"refused again after one": func(ask int) time.Duration { return map[bool]time.Duration{true: time.Second}[ask >= 2] },
	} {
		t.Run(name, func(t *testing.T) {
			env := exportEnv(t, 2500)
			env.limiter.refuse = refuse
			srv := httptest.NewServer(env.handler)
			defer srv.Close()
			req, err := http.NewRequest("GET", srv.URL+"/v1/links:export", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+shlinkGoodKey)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || err == nil {
				t.Fatalf("export refused at page 2: %d, read error %v; want 200 and a failed read", resp.StatusCode, err)
			}
			recs, _ := csv.NewReader(bytes.NewReader(body)).ReadAll()
			if len(recs) != 1001 {
				t.Errorf("export refused at page 2 sent %d records; want the header and page 1's 1,000 links", len(recs))
			}
			if got := env.limiter.takeCharged(); len(got) != 1 || len(env.shortener.lists) != 1 {
				t.Errorf("export refused at page 2: %d charges, %d ListLinks calls; want 1 and 1", len(got), len(env.shortener.lists))
			}
			if !strings.Contains(env.logs.String(), "export aborted: its next page was refused") {
				t.Errorf("no log line of the abort:\n%s", env.logs)
			}
		})
	}
}

// takenFile is an import of n rows whose keywords another tenant holds,
// and sh's record of them.
func takenFile(sh *bulkShortener, n int) string {
	var file strings.Builder
	file.WriteString("keyword,url\n")
	sh.taken = map[string]string{}
	for i := range n {
		code := fmt.Sprintf("taken%04d", i)
		sh.taken[code] = "https://elsewhere.example/"
		fmt.Fprintf(&file, "%s,https://example.com/%d\n", code, i)
	}
	return file.String()
}

// importOf sends body to POST /v1/links:import of h with shlinkGoodKey.
func importOf(h http.Handler, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/v1/links:import", strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+shlinkGoodKey)
	r.Header.Set("Content-Type", "text/csv")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// An import is charged as its route once per 1,000 rows it sends to the
// shortener, before it sends them (the admission pays the first): each row
// is a create and, where its code is taken, a look-up. 2,500 rows whose
// codes another tenant holds are 2,500 look-ups, then the same rows sent
// again for new codes: 5,000 rows, five charges, where they were one.
func TestImportIsChargedPerThousandRows(t *testing.T) {
	lim, sh := &shlinkLimiter{}, &bulkShortener{}
	h := serveFakes(t, lim, Deps{Shortener: sh})
	w := importOf(h, takenFile(sh, 2500))
	var got importResponse
	if err := json.Unmarshal(w.Body.Bytes(), &got); w.Code != http.StatusOK || err != nil || got.Created != 2500 || got.AliasesKept != 0 {
		t.Fatalf("import of 2,500 taken codes: %d %.300s; want 200, all created under new codes", w.Code, w.Body)
	}
	if charged, want := lim.takeCharged(), slices.Repeat([]string{importRoute}, 5); !slices.Equal(charged, want) || sh.gets != 2500 || len(sh.batches) != 6 {
		t.Errorf("charged %v for %d look-ups and %d batch calls; want %v for 2,500 and 6", charged, sh.gets, len(sh.batches), want)
	}

	// Refused before the second batch: the first's look-ups were paid by
	// the admission, nothing more is asked, and nothing was made: the
	// refusal itself, with its RateLimit fields.
	lim, sh = &shlinkLimiter{refuse: func(ask int) time.Duration { return map[bool]time.Duration{true: time.Minute}[ask >= 2] }}, &bulkShortener{}
	h = serveFakes(t, lim, Deps{Shortener: sh})
	w = importOf(h, takenFile(sh, 2500))
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "60" || len(w.Header()["RateLimit"]) != 1 {
		t.Errorf("import refused at its second charge: %d, Retry-After %q, RateLimit %q (%.300s); want 429, 60 and the fields",
			w.Code, w.Header().Get("Retry-After"), w.Header()["RateLimit"], w.Body)
	}
	if sh.gets != 1000 || len(sh.batches) != 1 {
		t.Errorf("import refused at its second charge: %d look-ups, %d batch calls; want the first batch's 1,000 and 1", sh.gets, len(sh.batches))
	}

	// Refused after rows were made: the report, the rows not reached
	// carrying the refusal, to be sent again.
	lim, sh = &shlinkLimiter{refuse: func(ask int) time.Duration { return map[bool]time.Duration{true: time.Minute}[ask >= 2] }}, &bulkShortener{}
	h = serveFakes(t, lim, Deps{Shortener: sh})
	w = importOf(h, "keyword,url\n"+strings.Repeat("k,https://example.com/\n", 1500))
	got = importResponse{}
	if err := json.Unmarshal(w.Body.Bytes(), &got); w.Code != http.StatusOK || err != nil || got.Created != 1000 || got.Failed != 500 {
		t.Fatalf("import of 1,500 refused at its second charge: %d %.300s; want 200, 1,000 created, 500 failed", w.Code, w.Body)
	}
	if e := got.Results[1200].Error; e == nil || e.Code != "RESOURCE_EXHAUSTED" || !strings.Contains(e.Message, "not imported: rate limit exceeded") {
		t.Errorf("a row not reached: %+v; want the edge quota's refusal", e)
	}
}

// The import answers the report of linkimport.Import: per row, in file
// order, aliases kept where given; a bad file is a 400 naming the
// formats; a batch failure after some rows leaves the rows not reached
// with that error, one before any row is the error itself.
// An import whose batch call times out after the shortener made its links
// is answered 200 with those rows unknown (to be looked up), not 503 with
// nothing said: sending the file again would make them twice.
func TestImportWhoseCallTimesOutReportsItsRowsUnknown(t *testing.T) {
	var file strings.Builder
	file.WriteString("keyword,url\n")
	for i := range 300 {
		fmt.Fprintf(&file, "to-%03d,https://example.com/%d\n", i, i)
	}
	sh := &bulkShortener{failBatch: 1, failAfterCommit: true, batchErr: status.Error(codes.DeadlineExceeded, "context deadline exceeded")}
	a := newBulkAPI(sh)
	w, err := bulkCall(a, a.importLinks, "POST", "/v1/links:import", file.String())
	if err != nil {
		t.Fatalf("import answered %v, want 200 with the rows unknown", err)
	}
	var got importResponse
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if w.Code != 200 || got.Unknown != 300 || got.Failed != 0 || got.Created != 0 || len(got.Results) != 300 {
		t.Fatalf("answer %d: unknown %d, failed %d, created %d, %d results; want 200 and 300 unknown", w.Code, got.Unknown, got.Failed, got.Created, len(got.Results))
	}
	for _, r := range got.Results {
		if !r.Unknown || r.Error == nil || r.Error.Code != "DEADLINE_EXCEEDED" || !strings.Contains(r.Error.Message, "may have been made") {
			t.Fatalf("row %d: %+v, want unknown: may have been made", r.Row, r)
		}
	}
}

func TestImportLinks(t *testing.T) {
	bitly := "link,long_url,tags\nbit.ly/abc123,https://example.com/1,X\nbit.ly/x,no-scheme,\nbit.ly/def456,,\n"
	sh := &bulkShortener{}
	a := newBulkAPI(sh)
	w, err := bulkCall(a, a.importLinks, "POST", "/v1/links:import", bitly)
	if err != nil {
		t.Fatal(err)
	}
	var got importResponse
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := importResponse{Format: "bitly", Rows: 3, Created: 1, AliasesKept: 1, Failed: 2, Results: []importResult{
		{Row: 2, SourceCode: "abc123", Code: "abc123", ShortURL: "http://k.test/abc123", AliasKept: true},
		{Row: 3, SourceCode: "x", Error: &itemError{Code: "INVALID_ARGUMENT", Message: "not a URL", Field: "long_url"}},
		{Row: 4, SourceCode: "def456", Error: &itemError{Code: "INVALID_ARGUMENT", Message: "line 4 has no URL", Field: "long_url"}},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("report:\n got %+v\nwant %+v", got, want)
	}
	if tags := sh.batches[0][0].GetTags(); !reflect.DeepEqual(tags, []string{"x", "import-bitly"}) {
		t.Errorf("tags sent = %q", tags)
	}

	for name, tc := range map[string]struct {
		body, contentType, wantText string
		wantStatus                  int
	}{
		"unknown header": {body: "a,b\n1,2\n", wantStatus: 400, wantText: "expected a Bitly export"},
		"empty":          {body: "", wantStatus: 400, wantText: "the file is empty"},
		"header only":    {body: "keyword,url\n", wantStatus: 400, wantText: "no rows"},
		"form":           {body: "x", contentType: "multipart/form-data; boundary=x", wantStatus: 400, wantText: "not a form"},
		"too large":      {body: "keyword,url\n" + strings.Repeat("k,https://example.com/\n", importBodyBytes/22+1), wantStatus: 413},
	} {
		t.Run(name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/v1/links:import", strings.NewReader(tc.body))
			if tc.contentType != "" {
				r.Header.Set("Content-Type", tc.contentType)
			}
			sh := &bulkShortener{}
			a := newBulkAPI(sh)
			err := a.importLinks(&call{w: httptest.NewRecorder(), r: r, st: &reqState{id: "t", tenant: "acme"}})
			if code, msg := statusOf(t, err); code != tc.wantStatus || !strings.Contains(msg, tc.wantText) {
				t.Errorf("got %d %q, want %d containing %q", code, msg, tc.wantStatus, tc.wantText)
			}
			if len(sh.batches) != 0 {
				t.Error("a refused file reached the shortener")
			}
		})
	}

	many := "keyword,url\n" + strings.Repeat("k,https://example.com/\n", 1500)
	// A quota, as the shortener refuses one: with kurz's ErrorInfo.
	quota := withDetails(t, codes.ResourceExhausted, "link quota exhausted", &errdetails.ErrorInfo{Reason: "RATE_LIMITED", Domain: rpcerr.Domain})
	sh = &bulkShortener{failBatch: 2, batchErr: quota}
	a = newBulkAPI(sh)
	w, err = bulkCall(a, a.importLinks, "POST", "/v1/links:import", many)
	if err != nil {
		t.Fatal(err)
	}
	got = importResponse{}
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Rows != 1500 || got.Created != 1000 || got.Failed != 500 || len(got.Results) != 1500 {
		t.Fatalf("rows %d created %d failed %d results %d; want 1500, 1000, 500, 1500", got.Rows, got.Created, got.Failed, len(got.Results))
	}
	if e := got.Results[1200].Error; e == nil || e.Code != "RESOURCE_EXHAUSTED" || !strings.Contains(e.Message, "not imported: link quota exhausted") {
		t.Errorf("row not reached: error %+v", e)
	}

	sh = &bulkShortener{failBatch: 1, batchErr: quota}
	a = newBulkAPI(sh)
	_, err = bulkCall(a, a.importLinks, "POST", "/v1/links:import", many)
	if code, _ := statusOf(t, err); code != http.StatusTooManyRequests {
		t.Errorf("failure before any row: %d, want 429", code)
	}
	if !bytes.Contains([]byte(fmt.Sprint(err)), []byte("quota")) {
		t.Errorf("error = %v", err)
	}

	// Sent again: a row found from the earlier run is reported even when
	// the quota stops the next batch before anything is created.
	sh = &bulkShortener{failBatch: 2, batchErr: quota,
		taken: map[string]string{"mine1": "https://example.com/m", "theirs": "https://example.com/t"}, mine: map[string]bool{"mine1": true}}
	a = newBulkAPI(sh)
	w, err = bulkCall(a, a.importLinks, "POST", "/v1/links:import", "keyword,url\nmine1,https://example.com/m\ntheirs,https://example.com/t\n")
	if err != nil {
		t.Fatalf("an import that found a row, then hit the quota: %v, want the report", err)
	}
	got = importResponse{}
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Existing != 1 || got.Created != 0 || got.Failed != 1 || got.Results[0].Code != "mine1" ||
		got.Results[1].Error == nil || got.Results[1].Error.Code != "RESOURCE_EXHAUSTED" {
		t.Errorf("report %+v; want row 2 existing as mine1 and row 3 not imported for the quota", got)
	}
}

// trackedBody is a request body that records whether it was read.
type trackedBody struct {
	io.Reader
	read bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	b.read = true
	return b.Reader.Read(p)
}

// With every bulk slot taken, a batch and an import of a body of
// undeclared length (chunked: it may be large) are answered 503
// UNAVAILABLE with a Retry-After before their body is read, and reach no
// service; once the slot is free, the same requests go through.
func TestBulkRequestsBeyondTheBoundRefusedUnread(t *testing.T) {
	sh := &bulkShortener{}
	a := newBulkAPI(sh)
	release, err := a.bulk.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	routes := []struct {
		handle       func(*call) error
		target, body string
	}{
		{a.routeHandler("POST /v1/links:batch"), "/v1/links:batch", `{"requests":[{"longUrl":"https://example.com/b"}]}`},
		{a.importLinks, "/v1/links:import", "long_url,link\nhttps://example.com/i,bit.ly/abc123\n"},
	}
	for _, rt := range routes {
		body := &trackedBody{Reader: strings.NewReader(rt.body)}
		r := httptest.NewRequest("POST", rt.target, body)
		w := httptest.NewRecorder()
		err := rt.handle(&call{w: w, r: r, st: &reqState{id: "t", ip: "203.0.113.9", tenant: "acme"}})
		e := toAPIError(err)
		if e.status != http.StatusServiceUnavailable || e.code != "UNAVAILABLE" || e.retryAfter != bulkRetryAfter || e.reason != reasonBulkSlotsBusy {
			t.Errorf("%s with the bound reached: %d %s reason %q retry %v (%v); want 503 UNAVAILABLE reason %s retry %v",
				rt.target, e.status, e.code, e.reason, e.retryAfter, err, reasonBulkSlotsBusy, bulkRetryAfter)
		}
		if body.read {
			t.Errorf("%s with the bound reached: the body was read", rt.target)
		}
	}
	if len(sh.batches) != 0 {
		t.Errorf("refused bulk requests reached the shortener %d times", len(sh.batches))
	}
	release()
	for _, rt := range routes {
		if _, err := bulkCall(a, rt.handle, "POST", rt.target, rt.body); err != nil {
			t.Errorf("%s with a free slot: %v", rt.target, err)
		}
	}
	if len(sh.batches) != 2 {
		t.Errorf("the shortener got %d batches, want one per request", len(sh.batches))
	}
}

// A tenant holds at most its share of the bulk slots: with two slots, one
// tenant's request in progress (a body sent a byte a second) leaves the
// other slot to the other tenants, and the tenant's next bulk request is
// answered 429 with a Retry-After, unread, until its first is done.
func TestBulkSlotsShareOutAmongTenants(t *testing.T) {
	sh := &bulkShortener{}
	a := newBulkAPI(sh)
	a.bulk, a.bulkShare = capacity.New(2, 0), 1
	as := func(tenant string) *call {
		r := httptest.NewRequest("POST", "/v1/links:batch", nil)
		return &call{w: httptest.NewRecorder(), r: r, st: &reqState{id: "t", ip: "203.0.113.9", tenant: tenant}}
	}
	slow := as("acme") // acme's slow request, of a large body
	slow.r.ContentLength = batchBodyBytes
	release, _, err := a.admitBulk(slow, batchBodyBytes)
	if err != nil {
		t.Fatal(err)
	}
	batch := a.routeHandler("POST /v1/links:batch")
	send := func(tenant string) (*trackedBody, error) {
		body := &trackedBody{Reader: strings.NewReader(`{"requests":[{"longUrl":"https://example.com/b"}]}`)}
		c := as(tenant)
		c.r = httptest.NewRequest("POST", "/v1/links:batch", body)
		return body, batch(c)
	}
	body, err := send("acme")
	if e := toAPIError(err); e.status != http.StatusTooManyRequests || e.code != "RESOURCE_EXHAUSTED" || e.reason != reasonBulkShareInUse || e.retryAfter != bulkRetryAfter || body.read {
		t.Errorf("acme's second bulk request: %d %s %s retry %v, body read %v (%v); want 429 RESOURCE_EXHAUSTED BULK_SHARE_IN_USE retry %v, unread",
			e.status, e.code, e.reason, e.retryAfter, body.read, err, bulkRetryAfter)
	}
	if _, err := send("globex"); err != nil {
		t.Errorf("another tenant's bulk request beside acme's: %v", err)
	}
	release()
	if _, err := send("acme"); err != nil {
		t.Errorf("acme's bulk request once its first is done: %v", err)
	}
	if len(sh.batches) != 2 || len(a.bulkHeld) != 0 {
		t.Errorf("the shortener got %d batches, %d tenants still hold slots; want 2 and none", len(sh.batches), len(a.bulkHeld))
	}
}

// The review's case: two tenants each send a batch declared as 4,000,000
// bytes, in time with the pacing (here: within the grace, which holds a
// slot as a body sent at 64 KiB/s or faster does, for up to ReadTimeout),
// and hold both slots of the default two. A third tenant's large batch is
// held off (503 BULK_SLOTS_BUSY, unread): that is what the slots are for.
// Its one-item batch, and its small import, declared within MaxBodyBytes,
// take no slot and go through, and so do the holders' own small ones: a
// tenant's share bounds its large bodies only.
func TestSmallBulkRequestPassesWhileLargeBodiesHoldEverySlot(t *testing.T) {
	defer func(g time.Duration) { bulkBodyGrace = g }(bulkBodyGrace)
	bulkBodyGrace = time.Minute // the holders' bodies stay in time for the whole test
	sh := &bulkShortener{}
	a := newBulkAPI(sh)
	a.bulk, a.bulkShare = capacity.New(2, 0), 1 // MaxBulkRequests 2, as by default
	batch := a.routeHandler("POST /v1/links:batch")
	done := make(chan error, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := batch(&call{w: w, r: r, st: &reqState{id: "t", ip: "203.0.113.9", tenant: r.Header.Get("X-Tenant")}})
		done <- err
		w.WriteHeader(toAPIError(err).status)
	}))
	defer srv.Close()
	for _, tenant := range []string{"acme", "globex"} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, "POST /v1/links:batch HTTP/1.1\r\nHost: x\r\nX-Tenant: "+tenant+
			"\r\nContent-Length: 4000000\r\n\r\n{\"requests\":["); err != nil {
			t.Fatal(err)
		}
	}
	held := func() int {
		a.bulkMu.Lock()
		defer a.bulkMu.Unlock()
		n := 0
		for _, k := range a.bulkHeld {
			n += k
		}
		return n
	}
	for deadline := time.Now().Add(5 * time.Second); held() < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the two large bodies hold %d slots after 5 s; want both", held())
		}
	}

	as := func(tenant, target, body string, length int64) (*trackedBody, *httptest.ResponseRecorder, error) {
		b := &trackedBody{Reader: strings.NewReader(body)}
		r := httptest.NewRequest("POST", target, b)
		r.ContentLength = length
		w := httptest.NewRecorder()
		handle := batch
		if target == "/v1/links:import" {
			handle = a.importLinks
		}
		return b, w, handle(&call{w: w, r: r, st: &reqState{id: "t", ip: "203.0.113.10", tenant: tenant}})
	}
	one := `{"requests":[{"longUrl":"https://example.com/one"}]}`
	body, _, err := as("initech", "/v1/links:batch", one, batchBodyBytes)
	if e := toAPIError(err); e.status != http.StatusServiceUnavailable || e.reason != reasonBulkSlotsBusy || body.read {
		t.Errorf("a third tenant's batch declared large: %d %s, body read %v (%v); want 503 %s, unread", e.status, e.reason, body.read, err, reasonBulkSlotsBusy)
	}
	body, _, err = as("initech", "/v1/links:batch", one, -1)
	if e := toAPIError(err); e.status != http.StatusServiceUnavailable || body.read {
		t.Errorf("a third tenant's batch of undeclared length: %d %s (%v); want 503, unread", e.status, e.reason, err)
	}
	for _, tc := range []struct{ tenant, target, body string }{
		{"initech", "/v1/links:batch", one},
		{"initech", "/v1/links:import", "keyword,url\nsmall-one,https://example.com/i\n"},
		{"acme", "/v1/links:batch", one}, // its share is held by its large body
	} {
		_, w, err := as(tc.tenant, tc.target, tc.body, int64(len(tc.body)))
		if err != nil || w.Code != http.StatusOK {
			t.Errorf("%s's small %s while large bodies hold every slot: %d (%v); want 200", tc.tenant, tc.target, w.Code, err)
		}
	}
	if len(sh.batches) != 3 {
		t.Errorf("the shortener got %d batches, want the 3 small requests'", len(sh.batches))
	}
	if n := held(); n != 2 {
		t.Errorf("%d slots held after the small requests; want the 2 large bodies' only", n)
	}
	// A body without a slot is read with the ordinary bound, whatever it
	// turns out to hold (net/http stops at the declared length; this one
	// reads on past it, as a recorder's does).
	for _, target := range []string{"/v1/links:batch", "/v1/links:import"} {
		_, _, err := as("initech", target, strings.Repeat(" ", 5000), 100)
		if code, msg := statusOf(t, err); code != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "larger than 1024 bytes") {
			t.Errorf("%s declared as 100 bytes, holding 5,000: %d %q; want 413 at MaxBodyBytes (1024)", target, code, msg)
		}
	}
}

// PATCH of rules alone names only rules in the mask, with the rules in
// proto JSON; variants: null clears the variants.
func TestUpdateLinkRulesAndVariants(t *testing.T) {
	sh := &bulkShortener{}
	a := newBulkAPI(sh)
	body := `{"rules":[{"name":"de","conditions":[{"languages":["de"]},{"query":{"param":"ref","value":"x"}}],"url":"https://example.com/de"}],"variants":null}`
	if _, err := bulkCall(a, a.routeHandler("PATCH /v1/links/{code}"), "PATCH", "/v1/links/abcd123", body); err != nil {
		t.Fatal(err)
	}
	if got, want := sh.update.GetUpdateMask().GetPaths(), []string{"rules", "variants"}; !reflect.DeepEqual(got, want) {
		t.Errorf("mask = %v, want %v", got, want)
	}
	l := sh.update.GetLink()
	if len(l.GetRules()) != 1 || l.GetRules()[0].GetConditions()[1].GetQuery().GetValue() != "x" || l.GetVariants() != nil {
		t.Errorf("link sent = %v", l)
	}
}

// A batch body of a million empty items is refused without building a
// message for each: protojson alone took ~370 MB of heap to read one.
func TestBatchOfManyTinyItemsIsRefusedCheaply(t *testing.T) {
	body := `{"requests":[{}` + strings.Repeat(",{}", (batchBodyBytes-20)/3) + `]}`
	sh := &bulkShortener{}
	a := newBulkAPI(sh)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := bulkCall(a, a.routeHandler("POST /v1/links:batch"), "POST", "/v1/links:batch", body)
	runtime.ReadMemStats(&after)
	// The body is read once (4 MB); the count stops at item 1,001.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
		t.Errorf("refusing it allocated %d MiB, want under 32", alloc>>20)
	}
	if code, msg := statusOf(t, err); code != 400 || !strings.Contains(msg, "it holds more than 1000") {
		t.Errorf("got %d %q, want 400 saying more than 1000", code, msg)
	}
	if len(sh.batches) != 0 {
		t.Error("a refused batch reached the shortener")
	}
}

// The lists inside an item are bounded the same way: one item of a million
// "{}" variants was ~190 MB of heap here (and 128 MiB in the shortener)
// before the shortener's bound of 10 refused it.
func TestBatchItemOfManyVariantsIsRefusedCheaply(t *testing.T) {
	body := `{"requests":[{"longUrl":"https://example.com/","variants":[{}` + strings.Repeat(",{}", (batchBodyBytes-80)/3) + `]}]}`
	sh := &bulkShortener{}
	a := newBulkAPI(sh)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := bulkCall(a, a.routeHandler("POST /v1/links:batch"), "POST", "/v1/links:batch", body)
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
		t.Errorf("refusing it allocated %d MiB, want under 32", alloc>>20)
	}
	if code, msg := statusOf(t, err); code != 400 || !strings.Contains(msg, "requests[0].variants holds more than 10") {
		t.Errorf("got %d %q, want 400 naming requests[0].variants", code, msg)
	}
	if len(sh.batches) != 0 {
		t.Error("a refused batch reached the shortener")
	}
}

func TestCountItems(t *testing.T) {
	for body, want := range map[string]int{
		`{"requests":[{},{},{}]}`:                           3,
		`{"other":[1,2,3],"requests":[{"requests":[1,2]}]}`: 1,
		`{"requests":["]","[",{"a":"],["}]}`:                3,
		`{"requests":[{}],"requests":[{},{}]}`:              3,
		`{"requests":{"a":1}}`:                              0,
		`[{},{}]`:                                           0,
		`{"requests":[{},{},{},{},{},{},{}]}`:               6, // stops at max+1
		`{"requests":[{},{}`:                                2,
	} {
		if got := countItems([]byte(body), "requests", 5); got != want {
			t.Errorf("countItems(%s) = %d, want %d", body, got, want)
		}
	}
}

// A bulk body trickled slower than bulkBodyMinRate is cut once it falls
// behind (here after a grace of 300 ms), answered 400, and its slot is
// given back at once: the next batch goes through, where two trickling
// tenants used to hold every slot until ReadTimeout.
func TestSlowBulkBodyIsCutAndItsSlotFreed(t *testing.T) {
	defer func(g time.Duration) { bulkBodyGrace = g }(bulkBodyGrace)
	bulkBodyGrace = 300 * time.Millisecond
	sh := &bulkShortener{}
	a := newBulkAPI(sh)
	batch := a.routeHandler("POST /v1/links:batch")
	trickleCut(t, batch, "POST /v1/links:batch")
	if _, err := bulkCall(a, batch, "POST", "/v1/links:batch", `{"requests":[{"longUrl":"https://example.com/b"}]}`); err != nil {
		t.Errorf("another bulk request once the slow one was cut: %v; want its slot free", err)
	}
}

// A clickCounts body, allowed past the usual bound without a bulk slot, is
// paced as a bulk body is: trickled, it is cut after the grace, not held
// until ReadTimeout.
func TestSlowClickCountsBodyIsCut(t *testing.T) {
	defer func(g time.Duration) { bulkBodyGrace = g }(bulkBodyGrace)
	bulkBodyGrace = 300 * time.Millisecond
	a := newBulkAPI(&bulkShortener{})
	trickleCut(t, a.routeHandler("POST /v1/links:clickCounts"), "POST /v1/links:clickCounts")
}

// trickleCut sends handle a request line of route's with a body declared
// as 4,000 bytes (past newBulkAPI's MaxBodyBytes: a batch of it takes a
// slot) a byte every 50 ms, far below bulkBodyMinRate, and fails unless
// handle answers 400 "too slowly", not before bulkBodyGrace.
func trickleCut(t *testing.T, handle func(*call) error, route string) {
	t.Helper()
	done := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := handle(&call{w: w, r: r, st: &reqState{id: "t", ip: "203.0.113.9", tenant: "acme"}})
		done <- err
		w.WriteHeader(toAPIError(err).status)
	}))
	defer srv.Close()
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Taken before the request is sent: the handler's grace starts when it
	// reads the body, which may be before anything after this write runs.
	start := time.Now()
	if _, err := io.WriteString(conn, route+" HTTP/1.1\r\nHost: x\r\nContent-Length: 4000\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() { // a byte every 50 ms, far below the rate
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := conn.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	select {
	case err := <-done:
		if e := toAPIError(err); e.status != http.StatusBadRequest || !strings.Contains(e.message, "too slowly") {
			t.Errorf("%s, a slow body: %d %q (%v); want 400 \"too slowly\"", route, e.status, e.message, err)
		}
		if took := time.Since(start); took < bulkBodyGrace {
			t.Errorf("%s, a slow body cut after %v; want not before the grace, %v", route, took, bulkBodyGrace)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: a body trickled a byte every 50 ms still read after 5 s; want it cut after the grace", route)
	}
}
