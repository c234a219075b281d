package linkimport

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/rpcerr"
)

// fakeShortener is a Creator over an in-memory code space: custom aliases
// are refused when taken (ALREADY_EXISTS) or listed as reserved
// (INVALID_ARGUMENT); URLs starting "bad" are refused; other links get
// sequential codes "s0000001", ...
type fakeShortener struct {
	// capacity, when above 0, refuses a larger batch as the link
	// creation quota does (BATCH_SIZE_INVALID, max_batch).
	capacity int
	taken    map[string]bool
	reserved map[string]bool
	// owned are the caller's links by alias (their URL): a custom alias
	// asked for again with its URL is answered with its link, not created,
	// as the shortener answers it.
	owned    map[string]string
	next     int
	calls    [][]*shortenerv1.CreateLinkRequest
	failCall int   // 1-based call that fails; 0: none
	failErr  error // its error (default: a plain one)
}

func newFake(taken ...string) *fakeShortener {
	f := &fakeShortener{taken: map[string]bool{}, reserved: map[string]bool{}}
	for _, c := range taken {
		f.taken[c] = true
	}
	return f
}

func (f *fakeShortener) create(_ context.Context, reqs []*shortenerv1.CreateLinkRequest) (*shortenerv1.BatchCreateLinksResponse, error) {
	f.calls = append(f.calls, reqs)
	if len(f.calls) == f.failCall {
		if f.failErr != nil {
			return nil, f.failErr
		}
		return nil, errors.New("quota exhausted")
	}
	if len(reqs) > MaxBatch {
		return nil, fmt.Errorf("batch of %d", len(reqs))
	}
	if f.capacity > 0 && len(reqs) > f.capacity {
		return nil, rpcerr.BadRequestWith("requests", "BATCH_SIZE_INVALID", "too many at once",
			map[string]string{"max_batch": fmt.Sprint(f.capacity)})
	}
	resp := &shortenerv1.BatchCreateLinksResponse{}
	for i, r := range reqs {
		res := &shortenerv1.BatchCreateResult{Index: int32(i)}
		switch {
		case len(r.GetLongUrl()) >= 3 && r.GetLongUrl()[:3] == "bad":
			res.Error = &shortenerv1.BatchItemError{Code: "INVALID_ARGUMENT", Field: "long_url", Message: "not a URL"}
		case r.GetMode() == shortenerv1.CodeMode_CODE_MODE_CUSTOM && f.reserved[r.GetCustomAlias()]:
			res.Error = &shortenerv1.BatchItemError{Code: "INVALID_ARGUMENT", Field: "custom_alias", Message: "reserved"}
		case r.GetMode() == shortenerv1.CodeMode_CODE_MODE_CUSTOM && f.owned[r.GetCustomAlias()] == r.GetLongUrl():
			code := r.GetCustomAlias()
			res.Link = &shortenerv1.Link{Code: code, ShortUrl: "http://kurz.test/" + code, LongUrl: r.GetLongUrl()}
		case r.GetMode() == shortenerv1.CodeMode_CODE_MODE_CUSTOM && f.taken[r.GetCustomAlias()]:
			res.Error = &shortenerv1.BatchItemError{Code: "ALREADY_EXISTS", Field: "custom_alias", Message: "taken"}
		default:
			code := r.GetCustomAlias()
			if r.GetMode() != shortenerv1.CodeMode_CODE_MODE_CUSTOM {
				f.next++
				code = fmt.Sprintf("s%07d", f.next)
			}
			f.taken[code] = true
			res.Link = &shortenerv1.Link{Code: code, ShortUrl: "http://kurz.test/" + code, LongUrl: r.GetLongUrl(), Tags: r.GetTags()}
			res.Created = true
			resp.Created++
		}
		resp.Results = append(resp.Results, res)
	}
	return resp, nil
}

func TestImportKeepsFreeAliases(t *testing.T) {
	f := newFake("taken1")
	f.reserved["promo1"] = true
	rows := []Row{
		{Line: 2, SourceCode: "free1", LongURL: "https://example.com/1", Tags: []string{"a", "import-bitly"}},
		{Line: 3, SourceCode: "taken1", LongURL: "https://example.com/2"},
		{Line: 4, SourceCode: "no", LongURL: "https://example.com/3"}, // too short for an alias
		{Line: 5, SourceCode: "free2", LongURL: ""},
		{Line: 6, SourceCode: "free3", LongURL: "bad url"},
		{Line: 7, SourceCode: "promo1", LongURL: "https://example.com/4"},
		{Line: 8, SourceCode: "", LongURL: "https://example.com/5"},
		{Line: 9, SourceCode: "free1", LongURL: "https://example.com/6"}, // the file's own duplicate
	}
	var progress [][2]int
	got, err := Import(context.Background(), rows, f.create, func(done, total int) { progress = append(progress, [2]int{done, total}) })
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	want := Report{Rows: 8, Created: 6, AliasesKept: 1, Failed: 2, Results: []Result{
		{Row: 2, SourceCode: "free1", Code: "free1", ShortURL: "http://kurz.test/free1", AliasKept: true},
		{Row: 3, SourceCode: "taken1", Code: "s0000003", ShortURL: "http://kurz.test/s0000003"},
		{Row: 4, SourceCode: "no", Code: "s0000001", ShortURL: "http://kurz.test/s0000001"},
		{Row: 5, SourceCode: "free2", Err: &shortenerv1.BatchItemError{Code: "INVALID_ARGUMENT", Field: "long_url", Message: "line 5 has no URL"}},
		{Row: 6, SourceCode: "free3", Err: &shortenerv1.BatchItemError{Code: "INVALID_ARGUMENT", Field: "long_url", Message: "not a URL"}},
		{Row: 7, SourceCode: "promo1", Code: "s0000004", ShortURL: "http://kurz.test/s0000004"},
		{Row: 8, Code: "s0000002", ShortURL: "http://kurz.test/s0000002"},
		{Row: 9, SourceCode: "free1", Code: "s0000005", ShortURL: "http://kurz.test/s0000005"},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("report:\n got %+v\nwant %+v", got, want)
	}
	if len(f.calls) != 2 {
		t.Fatalf("%d calls, want 2 (first pass, then the refused aliases)", len(f.calls))
	}
	if first := f.calls[0][0]; first.GetMode() != shortenerv1.CodeMode_CODE_MODE_CUSTOM || first.GetCustomAlias() != "free1" ||
		!reflect.DeepEqual(first.GetTags(), []string{"a", "import-bitly"}) {
		t.Errorf("first request = %v, want custom alias free1 with the row's tags", first)
	}
	for _, r := range f.calls[1] {
		if r.GetMode() != shortenerv1.CodeMode_CODE_MODE_SEQUENTIAL || r.GetCustomAlias() != "" {
			t.Errorf("retried request %v asks for an alias", r)
		}
	}
	if want := [][2]int{{5, 8}, {8, 8}}; !reflect.DeepEqual(progress, want) {
		t.Errorf("progress = %v, want %v", progress, want)
	}
}

func TestImportChunks(t *testing.T) {
	tests := map[string]struct {
		rows      int
		wantSizes []int
	}{
		"one":        {rows: 1, wantSizes: []int{1}},
		"exactly 1k": {rows: MaxBatch, wantSizes: []int{MaxBatch}},
		"max rows":   {rows: MaxRows + 1, wantSizes: []int{1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rows := make([]Row, tc.rows)
			for i := range rows {
				rows[i] = Row{Line: i + 2, LongURL: "https://example.com/"}
			}
			f := newFake()
			var calls int
			rep, err := Import(context.Background(), rows, f.create, func(done, total int) {
				calls++
				if total != tc.rows || done > total {
					t.Errorf("progress(%d, %d) of %d rows", done, total, tc.rows)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			var sizes []int
			for _, c := range f.calls {
				sizes = append(sizes, len(c))
			}
			if !reflect.DeepEqual(sizes, tc.wantSizes) {
				t.Errorf("chunk sizes = %v, want %v", sizes, tc.wantSizes)
			}
			if calls != len(tc.wantSizes) || rep.Created != tc.rows || len(rep.Results) != tc.rows {
				t.Errorf("progress calls %d, created %d, results %d; want %d, %d, %d",
					calls, rep.Created, len(rep.Results), len(tc.wantSizes), tc.rows, tc.rows)
			}
		})
	}
}

// A tenant whose quota holds fewer links at once than a chunk (its plan's
// burst) gets its rows in chunks of what it holds, every row created once.
func TestImportRechunksToWhatTheQuotaHolds(t *testing.T) {
	rows := make([]Row, 20)
	for i := range rows {
		rows[i] = Row{Line: i + 2, LongURL: fmt.Sprintf("https://example.com/%d", i)}
	}
	f := newFake()
	f.capacity = 7
	rep, err := Import(context.Background(), rows, f.create, nil)
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	for _, c := range f.calls {
		sizes = append(sizes, len(c))
	}
	if want := []int{20, 7, 7, 6}; !reflect.DeepEqual(sizes, want) {
		t.Errorf("chunk sizes = %v, want %v (the refused chunk, then chunks of 7)", sizes, want)
	}
	if rep.Created != 20 || rep.Failed != 0 || len(rep.Results) != 20 {
		t.Errorf("created %d, failed %d, results %d; want 20, 0, 20", rep.Created, rep.Failed, len(rep.Results))
	}
}

func TestImportStopsWhenCreateFails(t *testing.T) {
	rows := make([]Row, 1500)
	for i := range rows {
		rows[i] = Row{Line: i + 2, LongURL: "https://example.com/"}
	}
	f := newFake()
	f.failCall = 2
	rep, err := Import(context.Background(), rows, f.create, nil)
	if err == nil || rep.Created != 1000 || len(rep.Results) != 1000 {
		t.Fatalf("Import = created %d, results %d, err %v; want the first chunk's 1000 and an error", rep.Created, len(rep.Results), err)
	}
	if want := "batch create of lines 1002 to 1501: quota exhausted"; err.Error() != want {
		t.Errorf("error = %q, want %q", err, want)
	}
}

func TestImportRefusesInconsistentAnswer(t *testing.T) {
	short := func(context.Context, []*shortenerv1.CreateLinkRequest) (*shortenerv1.BatchCreateLinksResponse, error) {
		return &shortenerv1.BatchCreateLinksResponse{}, nil
	}
	_, err := Import(context.Background(), []Row{{Line: 2, LongURL: "https://example.com/"}}, short, nil)
	if err == nil {
		t.Fatal("Import took an answer without results")
	}
}

// An import run again creates nothing twice: a row whose source code is
// already the caller's link to the same URL (as the shortener stored it:
// host in lower case, a default port dropped) is reported Existing; a code
// the caller holds for another URL, or someone else's, still gets a new
// code.
func TestImportWithLookupFindsEarlierImports(t *testing.T) {
	f := newFake("mine", "mine-other", "theirs")
	owned := map[string]string{"mine": "https://example.com/a", "mine-other": "https://example.com/elsewhere"}
	lookup := func(_ context.Context, _, code string) (*shortenerv1.Link, bool, error) {
		u, ok := owned[code]
		if !ok {
			return nil, false, nil
		}
		return &shortenerv1.Link{Code: code, ShortUrl: "http://kurz.test/" + code, LongUrl: u}, true, nil
	}
	rows := []Row{
		{Line: 2, SourceCode: "mine", LongURL: "https://EXAMPLE.com:443/a"},
		{Line: 3, SourceCode: "mine-other", LongURL: "https://example.com/b"},
		{Line: 4, SourceCode: "theirs", LongURL: "https://example.com/c"},
		{Line: 5, SourceCode: "fresh", LongURL: "https://example.com/d"},
	}
	rep, err := ImportWith(context.Background(), rows, f.create, lookup, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Existing != 1 || rep.Created != 3 || rep.Failed != 0 {
		t.Errorf("existing %d, created %d, failed %d; want 1, 3, 0", rep.Existing, rep.Created, rep.Failed)
	}
	byRow := map[int]Result{}
	for _, r := range rep.Results {
		byRow[r.Row] = r
	}
	if r := byRow[2]; !r.Existing || r.Code != "mine" || r.ShortURL != "http://kurz.test/mine" {
		t.Errorf("row 2: %+v, want the existing link mine", r)
	}
	for _, line := range []int{3, 4} {
		if r := byRow[line]; r.Existing || r.Code == rows[line-2].SourceCode || r.Code == "" {
			t.Errorf("row %d: %+v, want a new code", line, r)
		}
	}
	if r := byRow[5]; r.Existing || r.Code != "fresh" {
		t.Errorf("row 5: %+v, want its alias created", r)
	}
}

// A row whose source code is the caller's link to the same URL that no
// longer redirects (disabled, expired) is not Existing: it fails naming
// why, on custom_alias, rather than being reported there while its short
// URL answers 410, or imported again under a new code.
func TestImportWithLookupFailsRowsWhoseLinkNoLongerRedirects(t *testing.T) {
	f := newFake("was-off", "was-over")
	lookup := func(_ context.Context, _, code string) (*shortenerv1.Link, bool, error) {
		l := &shortenerv1.Link{Code: code, ShortUrl: "http://kurz.test/" + code, LongUrl: "https://example.com/" + code}
		switch code {
		case "was-off":
			l.Disabled = true
		case "was-over":
			l.ExpireTime = timestamppb.New(time.Now().Add(-time.Second))
		}
		return l, true, nil
	}
	rows := []Row{
		{Line: 2, SourceCode: "was-off", LongURL: "https://example.com/was-off"},
		{Line: 3, SourceCode: "was-over", LongURL: "https://example.com/was-over"},
	}
	rep, err := ImportWith(context.Background(), rows, f.create, lookup, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Existing != 0 || rep.Created != 0 || rep.Failed != 2 {
		t.Errorf("existing %d, created %d, failed %d; want 0, 0, 2", rep.Existing, rep.Created, rep.Failed)
	}
	for i, why := range []string{"disabled", "expired"} {
		r := rep.Results[i]
		want := fmt.Sprintf("the alias %q is taken by your link to this URL, which no longer redirects (%s)", rows[i].SourceCode, why)
		if r.Existing || r.Code != "" || r.Err.GetCode() != "FAILED_PRECONDITION" || r.Err.GetField() != "custom_alias" || !strings.Contains(r.Err.GetMessage(), want) {
			t.Errorf("row %d: %+v; want it failed: %s", r.Row, r, want)
		}
	}
}

// A row the shortener answers with the caller's existing link (its alias
// already the caller's link to the same URL: created false) is reported
// Existing, not created, without a lookup; the other rows as before.
func TestImportReportsLinksTheShortenerHadAsExisting(t *testing.T) {
	f := newFake()
	f.owned = map[string]string{"mine": "https://example.com/a"}
	rows := []Row{
		{Line: 2, SourceCode: "mine", LongURL: "https://example.com/a"},
		{Line: 3, SourceCode: "fresh", LongURL: "https://example.com/b"},
	}
	rep, err := Import(context.Background(), rows, f.create, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Existing != 1 || rep.Created != 1 || rep.AliasesKept != 1 || len(f.calls) != 1 {
		t.Errorf("existing %d, created %d, aliases kept %d, %d calls; want 1, 1, 1, 1", rep.Existing, rep.Created, rep.AliasesKept, len(f.calls))
	}
	if r := rep.Results[0]; !r.Existing || r.Code != "mine" || r.Err != nil {
		t.Errorf("row 2: %+v, want the existing link mine", r)
	}
	if r := rep.Results[1]; r.Existing || r.Code != "fresh" {
		t.Errorf("row 3: %+v, want its alias created", r)
	}
}

// A row's URL is its stored link's when the shortener's normal form of it
// is what was stored: a Unicode host in punycode, a query's spaces, quotes
// and non-ASCII characters escaped; a URL that differs after that is
// another.
func TestSameURLFollowsTheShortenersNormalForm(t *testing.T) {
	for _, tc := range []struct {
		stored, row string
		want        bool
	}{
		{"https://example.com/", "https://EXAMPLE.com.:443", true},
		{"https://xn--bcher-kva.example/p", "https://bücher.example/p", true},
		{"https://xn--bcher-kva.example/p", "https://BÜCHER.example/p", true},
		{"https://example.com/s?q=a%20b", "https://example.com/s?q=a b", true},
		{"https://example.com/s?q=%22x%22", `https://example.com/s?q="x"`, true},
		{"https://example.com/s?q=%C3%A4&b=1", "https://example.com/s?q=ä&b=1", true},
		{"https://example.com/s?q=ä", "https://example.com/s?q=%C3%A4", true}, // stored before queries were escaped
		{"https://example.com/s?b=1&q=%C3%A4", "https://example.com/s?q=ä&b=1", false},
		{"https://example.com/s?q=a%26b", "https://example.com/s?q=a&b", false},
		{"https://xn--bcher-kva.example/p", "https://bucher.example/p", false},
		{"https://example.com/a", "https://example.com/b", false},
	} {
		if got := sameURL(tc.stored, tc.row); got != tc.want {
			t.Errorf("sameURL(%q, %q) = %v, want %v", tc.stored, tc.row, got, tc.want)
		}
	}
}

// Sent again after a stop, a file whose first chunk the quota refuses
// (its new rows do not fit yet) still reports the rows of the earlier run
// as existing, with the quota's error for the rest.
func TestImportWithLookupReportsExistingRowsOfARefusedChunk(t *testing.T) {
	f := newFake("mine")
	f.failCall = 1
	f.failErr = rpcerr.RetryLater(codes.ResourceExhausted, rpcerr.ReasonRateLimited, "quota", time.Second, nil)
	lookup := func(_ context.Context, _, code string) (*shortenerv1.Link, bool, error) {
		if code != "mine" {
			return nil, false, nil
		}
		return &shortenerv1.Link{Code: code, ShortUrl: "http://kurz.test/mine", LongUrl: "https://example.com/a"}, true, nil
	}
	rows := []Row{
		{Line: 2, SourceCode: "mine", LongURL: "https://example.com/a"},
		{Line: 3, SourceCode: "fresh", LongURL: "https://example.com/b"},
	}
	rep, err := ImportWith(context.Background(), rows, f.create, lookup, nil)
	if err == nil || !rateLimited(err) {
		t.Fatalf("error %v, want the quota's", err)
	}
	if rep.Existing != 1 || rep.Created != 0 || len(rep.Results) != 1 || rep.Results[0].Code != "mine" {
		t.Errorf("report %+v; want line 2 existing as mine, line 3 not reached", rep)
	}
}

// A lookup that fails fails its row only: the chunk's other rows were made,
// and are reported (stopping there left them "not reached", to be sent
// again and made twice).
func TestImportWithFailingLookupFailsItsRowOnly(t *testing.T) {
	rows := []Row{
		{Line: 2, SourceCode: "taken1", LongURL: "https://example.com/1"},
		{Line: 3, SourceCode: "fresh2", LongURL: "https://example.com/2"},
	}
	f := newFake("taken1")
	lookup := func(context.Context, string, string) (*shortenerv1.Link, bool, error) {
		return nil, false, errors.New("deadline exceeded")
	}
	rep, err := ImportWith(context.Background(), rows, f.create, lookup, nil)
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if len(rep.Results) != 2 || rep.Created != 1 || rep.Results[1].Code != "fresh2" {
		t.Fatalf("report %+v, want line 3 created", rep)
	}
	if e := rep.Results[0].Err; e == nil || e.GetCode() != "UNAVAILABLE" || !strings.Contains(e.GetMessage(), "look it up") {
		t.Errorf("line 2: %+v, want UNAVAILABLE saying to look it up", rep.Results[0])
	}
}

// Every format's title reaches the shortener with its row, on the first
// pass and on the pass that gives a refused alias a new code: an import
// keeps what the other shortener showed of each link. A kurz export's
// title comes back untrimmed, as it was exported.
func TestImportCarriesTitles(t *testing.T) {
	files := map[string]struct {
		csv  string
		want []string
	}{
		"yourls": {"keyword,url,title,timestamp,ip,clicks\nfree1,https://example.com/1,Home page,2012-05-01 10:00:00,127.0.0.1,7\n" +
			"taken1,https://example.com/2,Über uns <script>,2012-05-01 10:00:00,127.0.0.1,1\n", []string{"Home page", "Über uns <script>"}},
		"bitly": {"long_url,link,title\nhttps://example.com/1,bit.ly/free1,  Launch  \nhttps://example.com/2,bit.ly/taken1,\n", []string{"Launch", ""}},
		"kurz": {"code,short_url,long_url,tags,password_protected,title\nfree1,http://k.test/free1,https://example.com/1,,false,  spaced  \n" +
			"taken1,http://k.test/taken1,https://example.com/2,,false,'=1+1\n", []string{"  spaced  ", "=1+1"}},
	}
	for name, tc := range files {
		t.Run(name, func(t *testing.T) {
			_, rows, err := Parse(strings.NewReader(tc.csv))
			if err != nil {
				t.Fatal(err)
			}
			f := newFake("taken1")
			if _, err := Import(context.Background(), rows, f.create, nil); err != nil {
				t.Fatal(err)
			}
			if len(f.calls) != 2 || len(f.calls[0]) != 2 || len(f.calls[1]) != 1 {
				t.Fatalf("calls %v, want both rows, then the refused alias's row again", f.calls)
			}
			for i, want := range tc.want {
				if got := f.calls[0][i].GetTitle(); got != want {
					t.Errorf("row %d sent with title %q, want %q", i+2, got, want)
				}
			}
			if got := f.calls[1][0].GetTitle(); got != tc.want[1] {
				t.Errorf("the refused alias's row sent again with title %q, want %q", got, tc.want[1])
			}
		})
	}
}
