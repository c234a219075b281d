//go:build integration

package app

import (
	"crypto/rand"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// apiLink is a Link as the API writes it.
type apiLink struct {
	Code              string   `json:"code"`
	ShortURL          string   `json:"shortUrl"`
	LongURL           string   `json:"longUrl"`
	Tenant            string   `json:"tenant"`
	RedirectType      string   `json:"redirectType"`
	CreateTime        string   `json:"createTime"`
	UpdateTime        string   `json:"updateTime"`
	ExpireTime        string   `json:"expireTime"`
	Disabled          bool     `json:"disabled"`
	Tags              []string `json:"tags"`
	MaxVisits         string   `json:"maxVisits"`
	PasswordProtected bool     `json:"passwordProtected"`
	DeviceTargets     *struct {
		IOSURL     string `json:"iosUrl"`
		AndroidURL string `json:"androidUrl"`
		DesktopURL string `json:"desktopUrl"`
	} `json:"deviceTargets"`
	Rules    []json.RawMessage `json:"rules"`
	Variants []json.RawMessage `json:"variants"`
	ETag     string            `json:"etag"`
	Title    string            `json:"title"`
}

// batchAnswer is the answer of POST /v1/links:batch.
type batchAnswer struct {
	Results []struct {
		Index   int      `json:"index"`
		Link    *apiLink `json:"link"`
		Created bool     `json:"created"`
		Error   *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Field   string `json:"field"`
		} `json:"error"`
	} `json:"results"`
	Created int `json:"created"`
}

// importAnswer is the answer of POST /v1/links:import.
type importAnswer struct {
	Format      string `json:"format"`
	Rows        int    `json:"rows"`
	Created     int    `json:"created"`
	AliasesKept int    `json:"aliasesKept"`
	Existing    int    `json:"existing"`
	Failed      int    `json:"failed"`
	Results     []struct {
		Row        int    `json:"row"`
		SourceCode string `json:"sourceCode"`
		Code       string `json:"code"`
		ShortURL   string `json:"shortUrl"`
		AliasKept  bool   `json:"aliasKept"`
		Existing   bool   `json:"existing"`
		Error      *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Field   string `json:"field"`
		} `json:"error"`
	} `json:"results"`
}

// decodeAnswer decodes r's body into v (unknown fields refused), failing
// the test unless r has status want.
func decodeAnswer(t *testing.T, r response, want int, v any) {
	t.Helper()
	if r.code != want {
		t.Fatalf("got %s, want %d", r, want)
	}
	if err := decodeStrict(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

// A batch of 1,000 with some bad items answers one result per item in
// order: the bad ones fail alone with the field at fault, the others are
// created (and listed); 1,001 items are refused whole. The tag filter of
// GET /v1/links returns exactly the links carrying the tag.
func TestBatchCreateAndTagFilter(t *testing.T) {
	gw := startGateway(t, nil)
	c := newClient(t, gw, newTenant(t, gw, "free").key)

	const n = 1000
	items := make([]map[string]any, n)
	bad := map[int]string{} // index -> the field at fault
	for i := range items {
		tag := "odd"
		if i%2 == 0 {
			tag = "even"
		}
		items[i] = map[string]any{"longUrl": fmt.Sprintf("https://example.com/batch/%d", i), "tags": []string{"batch", tag}}
		switch {
		case i%97 == 5:
			items[i]["longUrl"] = "javascript:alert(1)"
			bad[i] = "long_url"
		case i == 500:
			items[i]["tags"] = []string{"Not A Tag!"}
			bad[i] = "tags"
		}
	}
	body, err := json.Marshal(map[string]any{"requests": items})
	if err != nil {
		t.Fatal(err)
	}
	var got batchAnswer
	decodeAnswer(t, c.do("POST", "/v1/links:batch", string(body)), http.StatusOK, &got)
	if len(got.Results) != n || got.Created != n-len(bad) {
		t.Fatalf("%d results, created %d; want %d and %d", len(got.Results), got.Created, n, n-len(bad))
	}
	evens := 0
	for i, r := range got.Results {
		if r.Index != i {
			t.Fatalf("result %d has index %d", i, r.Index)
		}
		if field, isBad := bad[i]; isBad {
			if r.Link != nil || r.Error == nil || r.Error.Code != "INVALID_ARGUMENT" || r.Error.Field != field || r.Error.Message == "" {
				t.Errorf("item %d: link %v, error %+v; want INVALID_ARGUMENT on %s with a message", i, r.Link, r.Error, field)
			}
			continue
		}
		if r.Error != nil || r.Link == nil || r.Link.LongURL != items[i]["longUrl"] || !slices.Contains(r.Link.Tags, "batch") {
			t.Errorf("item %d: link %+v, error %+v; want the link with its URL and tags", i, r.Link, r.Error)
		}
		if i%2 == 0 {
			evens++
		}
	}
	if total := linkCount(t, c); total != got.Created {
		t.Errorf("the tenant has %d links, want the %d created", total, got.Created)
	}

	// The tag filter, across pages.
	var listed []apiLink
	token := ""
	for {
		var page struct {
			Links         []apiLink `json:"links"`
			NextPageToken string    `json:"nextPageToken"`
		}
		decodeAnswer(t, c.do("GET", "/v1/links?tag=even&page_size=300"+token, ""), http.StatusOK, &page)
		listed = append(listed, page.Links...)
		if page.NextPageToken == "" {
			break
		}
		token = "&page_token=" + page.NextPageToken
	}
	if len(listed) != evens {
		t.Errorf("?tag=even listed %d links, want %d", len(listed), evens)
	}
	for _, l := range listed {
		if !slices.Contains(l.Tags, "even") {
			t.Errorf("?tag=even listed %s with tags %v", l.Code, l.Tags)
		}
	}
	if r := c.do("GET", "/v1/links?tag=Not%20A%20Tag!", ""); r.code != http.StatusBadRequest {
		t.Errorf("?tag= with a bad tag: %s, want 400", r)
	}

	// 1,001 items: refused whole, nothing created.
	items = append(items, map[string]any{"longUrl": "https://example.com/one-too-many"})
	body, _ = json.Marshal(map[string]any{"requests": items})
	r := c.do("POST", "/v1/links:batch", string(body))
	if e := r.apiError(t); r.code != http.StatusBadRequest || !strings.Contains(e["detail"].(string), "1 to 1000") {
		t.Errorf("1001 items: %s, want 400 naming the limit", r)
	}
	if total := linkCount(t, c); total != got.Created {
		t.Errorf("after the refused batch the tenant has %d links, want %d", total, got.Created)
	}
}

// Links take tags, a visit limit, a password and device targets on create
// and PATCH (and clear them: [], 0, "", null); the password never comes
// back in any answer (create, get, list, patch, batch, export, errors),
// only passwordProtected.
func TestLinkFeaturesPatchAndPassword(t *testing.T) {
	gw := startGateway(t, nil)
	c := newClient(t, gw, newTenant(t, gw, "free").key)
	const password, password2 = "correct horse battery", "staple-staple-staple"
	var answers []response
	check := func(r response, want int) response {
		t.Helper()
		answers = append(answers, r)
		if r.code != want {
			t.Fatalf("got %s, want %d", r, want)
		}
		return r
	}

	var l apiLink
	r := check(c.do("POST", "/v1/links", `{"longUrl":"https://example.com/f","tags":["Launch","q3"],"maxVisits":"3",`+
		`"password":"`+password+`","deviceTargets":{"iosUrl":"https://apps.apple.com/app/x","androidUrl":"https://play.google.com/store/apps/x"}}`), http.StatusCreated)
	decodeAnswer(t, r, http.StatusCreated, &l)
	if !l.PasswordProtected || l.MaxVisits != "3" || !slices.Equal(l.Tags, []string{"launch", "q3"}) || l.DeviceTargets == nil ||
		l.DeviceTargets.IOSURL != "https://apps.apple.com/app/x" || l.DeviceTargets.DesktopURL != "" {
		t.Errorf("created %+v", l)
	}
	code := l.Code

	var p apiLink
	decodeAnswer(t, check(c.do("PATCH", "/v1/links/"+code, `{"tags":["x"],"maxVisits":"10","deviceTargets":{"desktopUrl":"https://example.com/desk"}}`), 200), 200, &p)
	if !p.PasswordProtected || p.MaxVisits != "10" || !slices.Equal(p.Tags, []string{"x"}) || p.DeviceTargets == nil ||
		p.DeviceTargets.DesktopURL != "https://example.com/desk" || p.DeviceTargets.IOSURL != "" {
		t.Errorf("after PATCH %+v", p)
	}
	p = apiLink{}
	decodeAnswer(t, check(c.do("PATCH", "/v1/links/"+code, `{"password":"","maxVisits":0,"tags":[],"deviceTargets":null}`), 200), 200, &p)
	if d := p.DeviceTargets; p.PasswordProtected || p.MaxVisits != "0" || len(p.Tags) != 0 ||
		d != nil && (d.IOSURL != "" || d.AndroidURL != "" || d.DesktopURL != "") {
		t.Errorf("after clearing: %+v", p)
	}
	p = apiLink{}
	decodeAnswer(t, check(c.do("PATCH", "/v1/links/"+code, `{"password":"`+password2+`"}`), 200), 200, &p)
	if !p.PasswordProtected {
		t.Errorf("after setting a password again: %+v", p)
	}
	if r := check(c.do("PATCH", "/v1/links/"+code, `{"password":"short"}`), 400); !strings.Contains(string(r.body), "password") {
		t.Errorf("a short password: %s", r)
	}
	if r := check(c.do("PATCH", "/v1/links/"+code, `{"passwordProtected":false}`), 400); !strings.Contains(string(r.body), "deviceTargets") {
		t.Errorf("PATCH of an output-only field: %s", r)
	}
	p = apiLink{}
	decodeAnswer(t, check(c.do("GET", "/v1/links/"+code, ""), 200), 200, &p)
	if !p.PasswordProtected {
		t.Errorf("GET %+v", p)
	}
	check(c.do("GET", "/v1/links", ""), 200)
	check(c.do("POST", "/v1/links:batch", `{"requests":[{"longUrl":"https://example.com/b","password":"`+password+`"}]}`), 200)
	check(c.do("GET", "/v1/links:export", ""), 200)

	for _, a := range answers {
		// "password" may name a field at fault in an error; never a member.
		if s := string(a.body); strings.Contains(s, password) || strings.Contains(s, password2) || strings.Contains(s, `"password":`) {
			t.Errorf("an answer carries the password: %s", s)
		}
	}
}

// The export is the tenant's links as CSV that parses back to what was
// created, titles included, with a formula-looking cell neutralised; ?tag=
// narrows it.
func TestExportRoundTrip(t *testing.T) {
	gw := startGateway(t, nil)
	c := newClient(t, gw, newTenant(t, gw, "free").key)
	expire := time.Now().Add(48 * time.Hour).UTC().Truncate(time.Second)
	body := `{"requests":[
		{"longUrl":"https://example.com/e/1","tags":["-sum","rt"],"title":"=SUM(A1), \"quoted\" <b>"},
		{"longUrl":"https://example.com/e/2?a=1,b=2","tags":["rt"],"title":"  spaced ✓  ","maxVisits":"5","expireTime":"` + expire.Format(time.RFC3339) + `"},
		{"longUrl":"https://example.com/e/3","tags":["rt","other"],"password":"correct horse battery",
		 "deviceTargets":{"iosUrl":"https://example.com/ios","androidUrl":"https://example.com/android","desktopUrl":"https://example.com/desktop"}},
		{"longUrl":"https://example.com/e/4","redirectType":"REDIRECT_TYPE_MOVED_PERMANENTLY",
		 "rules":[{"name":"de","conditions":[{"languages":["de"]}],"url":"https://example.com/e/4/de"}],
		 "variants":[{"name":"a","url":"https://example.com/e/4/a","weight":1},{"name":"b","url":"https://example.com/e/4/b","weight":2}]}
	]}`
	var created batchAnswer
	decodeAnswer(t, c.do("POST", "/v1/links:batch", body), http.StatusOK, &created)
	if created.Created != 4 {
		t.Fatalf("created %d of 4: %+v", created.Created, created.Results)
	}

	r := c.do("GET", "/v1/links:export", "")
	if r.code != http.StatusOK || r.header.Get("Content-Type") != "text/csv; charset=utf-8" ||
		r.header.Get("Content-Disposition") != `attachment; filename="kurz-links.csv"` {
		t.Fatalf("export: %d %q %q", r.code, r.header.Get("Content-Type"), r.header.Get("Content-Disposition"))
	}
	recs, err := csv.NewReader(strings.NewReader(string(r.body))).ReadAll()
	if err != nil {
		t.Fatalf("the export is not CSV: %v\n%s", err, r.body)
	}
	header := []string{"code", "short_url", "long_url", "tags", "created_at", "expires_at", "max_visits", "disabled",
		"password_protected", "ios_url", "android_url", "desktop_url", "domain", "redirect_type", "rules", "variants", "title"}
	if len(recs) != 5 || !slices.Equal(recs[0], header) {
		t.Fatalf("export has %d records, header %q; want 5 and %q", len(recs), recs[0], header)
	}
	byCode := map[string][]string{}
	for _, rec := range recs[1:] {
		byCode[rec[0]] = rec
	}
	for i, res := range created.Results {
		l := res.Link
		rec, ok := byCode[l.Code]
		if !ok {
			t.Errorf("link %d (%s) is not in the export", i, l.Code)
			continue
		}
		ct, err := time.Parse(time.RFC3339Nano, l.CreateTime)
		if err != nil {
			t.Fatal(err)
		}
		tags := strings.Join(l.Tags, "|")
		if strings.HasPrefix(tags, "-") {
			tags = "'" + tags // the neutralised cell
		}
		want := []string{l.Code, l.ShortURL, l.LongURL, tags, ct.UTC().Format(time.RFC3339Nano), "", "", "false",
			fmt.Sprint(l.PasswordProtected), "", "", "", "", "", "", "", l.Title}
		if strings.HasPrefix(l.Title, "=") {
			want[16] = "'" + l.Title // the neutralised cell
		}
		if i == 3 {
			want[13], want[14] = "301", `[{"name":"de","conditions":[{"languages":["de"]}],"url":"https://example.com/e/4/de"}]`
			want[15] = `[{"name":"a","url":"https://example.com/e/4/a","weight":1},{"name":"b","url":"https://example.com/e/4/b","weight":2}]`
		}
		if l.ExpireTime != "" {
			want[5] = expire.Format(time.RFC3339)
		}
		if l.MaxVisits != "0" {
			want[6] = l.MaxVisits
		}
		if d := l.DeviceTargets; d != nil {
			want[9], want[10], want[11] = d.IOSURL, d.AndroidURL, d.DesktopURL
		}
		if !slices.Equal(rec, want) {
			t.Errorf("link %d:\n export %q\n   want %q", i, rec, want)
		}
	}
	if l := created.Results[1].Link; l.Title != "  spaced ✓  " {
		t.Errorf("the second link's title is %q; want it kept as sent", l.Title)
	}
	if rec := byCode[created.Results[0].Link.Code]; rec == nil || rec[3] != "'-sum|rt" {
		t.Errorf("the first link's record is %q; want its tags cell \"-sum|rt\" neutralised as \"'-sum|rt\"", rec)
	}
	if strings.Contains(string(r.body), "correct horse") {
		t.Error("the export carries a password")
	}

	// The export imported into another tenant makes the same links (new
	// codes: these are the first tenant's), but for the password-protected
	// one, which fails its row rather than come back open.
	c2 := newClient(t, gw, newTenant(t, gw, "free").key)
	var imp importAnswer
	decodeAnswer(t, c2.do("POST", "/v1/links:import", string(r.body), "Content-Type", "text/csv"), http.StatusOK, &imp)
	if imp.Format != "kurz" || imp.Created != 3 || imp.Failed != 1 || imp.AliasesKept != 0 {
		t.Fatalf("import of the export: %+v; want kurz, 3 created under new codes, 1 failed", imp)
	}
	for _, res := range imp.Results {
		if (res.Error != nil) != (res.SourceCode == created.Results[2].Link.Code) {
			t.Errorf("import row %d (%s): error %+v; want an error for the password-protected link only", res.Row, res.SourceCode, res.Error)
		}
	}
	again := c2.do("GET", "/v1/links:export", "")
	recs2, err := csv.NewReader(strings.NewReader(string(again.body))).ReadAll()
	if err != nil || len(recs2) != 4 {
		t.Fatalf("the second tenant's export: %v, %d records; want the header and 3", err, len(recs2))
	}
	settings := func(rec []string) string { return strings.Join(append([]string{rec[2], rec[3]}, rec[5:]...), ",") }
	var want2, got2 []string
	for _, rec := range recs[1:] {
		if rec[0] != created.Results[2].Link.Code {
			want2 = append(want2, settings(rec))
		}
	}
	for _, rec := range recs2[1:] {
		got2 = append(got2, settings(rec))
	}
	slices.Sort(want2)
	slices.Sort(got2)
	if !slices.Equal(got2, want2) {
		t.Errorf("links after the round trip (URL, tags, then expiry on):\n got %q\nwant %q", got2, want2)
	}

	r = c.do("GET", "/v1/links:export?tag=other", "")
	recs, err = csv.NewReader(strings.NewReader(string(r.body))).ReadAll()
	if err != nil || len(recs) != 2 || recs[1][0] != created.Results[2].Link.Code {
		t.Errorf("?tag=other: %v, %q; want the header and link 3", err, recs)
	}
}

// importFixture reads a CSV from testdata with {{run}} made unique to this
// run, so its aliases are free.
func importFixture(t *testing.T, name, run string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(string(b), "{{run}}", run)
}

// runID is 6 random lower-case letters.
func runID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = 'a' + b[i]%26
	}
	return string(b[:])
}

// Importing a Bitly and a YOURLS export keeps each row's code where it is
// a free kurz alias, and its title; a taken or unusable code gets a new
// code; a bad row fails alone; every link is tagged with its source.
func TestImportBitlyAndYOURLS(t *testing.T) {
	gw := startGateway(t, nil)
	c := newClient(t, gw, newTenant(t, gw, "free").key)
	run := runID()
	taken := "imp" + run + "tk"
	if r := c.do("POST", "/v1/links", `{"longUrl":"https://example.com/first","customAlias":"`+taken+`"}`); r.code != http.StatusCreated {
		t.Fatalf("take the alias: %s", r)
	}
	csvType := []string{"Content-Type", "", "Content-Type", "text/csv"}

	type want struct {
		source, code string // code "" : a new one, not source
		kept         bool
		errField     string
		longURL      string
	}
	for _, tc := range []struct {
		file, format string
		rows         []want
	}{
		{"linkimport-bitly.csv", "bitly", []want{
			{source: "imp" + run + "b1", code: "imp" + run + "b1", kept: true, longURL: "https://example.com/spring-sale"},
			{source: taken, longURL: "https://example.com/taken"},
			{source: "imp" + run + "b3", errField: "long_url"},
			{source: "ab", longURL: "https://example.com/too-short-code"},
			{source: "imp" + run + "b5", code: "imp" + run + "b5", kept: true, longURL: "https://example.com/five"},
		}},
		{"linkimport-yourls.csv", "yourls", []want{
			{source: "imp" + run + "y1", code: "imp" + run + "y1", kept: true, longURL: "https://yourls.org/"},
			{source: "imp" + run + "y2", code: "imp" + run + "y2", kept: true, longURL: "http://example.org/page?a=1&b=2"},
			{source: "imp" + run + "y3", errField: "long_url"},
			{source: "healthz", longURL: "https://example.org/reserved"},
		}},
	} {
		t.Run(tc.format, func(t *testing.T) {
			var got importAnswer
			decodeAnswer(t, c.do("POST", "/v1/links:import", importFixture(t, tc.file, run), csvType...), http.StatusOK, &got)
			wantCreated, wantKept := 0, 0
			for _, w := range tc.rows {
				if w.errField == "" {
					wantCreated++
				}
				if w.kept {
					wantKept++
				}
			}
			if got.Format != tc.format || got.Rows != len(tc.rows) || got.Created != wantCreated || got.AliasesKept != wantKept ||
				got.Failed != len(tc.rows)-wantCreated || len(got.Results) != len(tc.rows) {
				t.Fatalf("report %+v; want format %s, %d rows, %d created, %d kept", got, tc.format, len(tc.rows), wantCreated, wantKept)
			}
			for i, w := range tc.rows {
				res := got.Results[i]
				if res.SourceCode != w.source || res.AliasKept != w.kept {
					t.Errorf("row %d: source %q kept %v; want %q %v", i, res.SourceCode, res.AliasKept, w.source, w.kept)
				}
				if w.errField != "" {
					if res.Error == nil || res.Error.Field != w.errField || res.Code != "" {
						t.Errorf("row %d: %+v; want an error on %s alone", i, res, w.errField)
					}
					continue
				}
				if res.Error != nil || res.Code == "" || (w.code != "" && res.Code != w.code) || (w.code == "" && res.Code == w.source) {
					t.Errorf("row %d: code %q, error %+v; want code %q (or a new one)", i, res.Code, res.Error, w.code)
					continue
				}
				var l apiLink
				decodeAnswer(t, c.do("GET", "/v1/links/"+res.Code, ""), http.StatusOK, &l)
				if l.LongURL != w.longURL || !slices.Contains(l.Tags, "import-"+tc.format) || l.ShortURL != res.ShortURL {
					t.Errorf("row %d: link %+v; want %s tagged import-%s", i, l, w.longURL, tc.format)
				}
			}
		})
	}

	// The YOURLS file sent again: the rows that kept their code are the
	// links the first run made (existing, nothing created); the reserved
	// code's row, which got a new code, gets another; the bad URL fails.
	var again importAnswer
	decodeAnswer(t, c.do("POST", "/v1/links:import", importFixture(t, "linkimport-yourls.csv", run), csvType...), http.StatusOK, &again)
	if again.Existing != 2 || again.Created != 1 || again.Failed != 1 {
		t.Errorf("the same file again: existing %d, created %d, failed %d; want 2, 1, 1", again.Existing, again.Created, again.Failed)
	}
	for _, i := range []int{0, 1} {
		if r := again.Results[i]; !r.Existing || r.Code != r.SourceCode {
			t.Errorf("row %d again: %+v; want the first run's link, existing", i, r)
		}
	}

	var first apiLink
	decodeAnswer(t, c.do("GET", "/v1/links/imp"+run+"b1", ""), http.StatusOK, &first)
	if !slices.Equal(first.Tags, []string{"campaign-2024", "spring", "import-bitly"}) || first.Title != "Spring sale" {
		t.Errorf("the first Bitly row's tags are %q, title %q; want its tags and its title, Spring sale", first.Tags, first.Title)
	}
	// The titles of both files are kept, a comma in one too, and a row
	// without one has none.
	for code, want := range map[string]string{"imp" + run + "b5": "Title, with comma", "imp" + run + "y1": "YOURLS", "imp" + run + "y2": ""} {
		var l apiLink
		decodeAnswer(t, c.do("GET", "/v1/links/"+code, ""), http.StatusOK, &l)
		if l.Title != want {
			t.Errorf("imported %s has title %q, want %q", code, l.Title, want)
		}
	}
	var taker apiLink
	decodeAnswer(t, c.do("GET", "/v1/links/"+taken, ""), http.StatusOK, &taker)
	if taker.LongURL != "https://example.com/first" {
		t.Errorf("the import changed the link that held the alias: %+v", taker)
	}

	for name, tc := range map[string]struct {
		body, want string
	}{
		"unknown header": {"url,short\nhttps://example.com/,x\n", "expected a Bitly export"},
		"not CSV":        {"long_url,link\n\"https://example.com/\n", "not valid CSV"},
	} {
		r := c.do("POST", "/v1/links:import", tc.body, csvType...)
		if e := r.apiError(t); r.code != http.StatusBadRequest || !strings.Contains(e["detail"].(string), tc.want) {
			t.Errorf("%s: %s, want 400 containing %q", name, r, tc.want)
		}
	}
}

// A YOURLS row whose keyword is the tenant's link to the same URL that no
// longer redirects (here disabled) is not reported existing, as if it were
// there: it fails on custom_alias, naming why and what to do; once the
// link is enabled again, the same row is existing.
func TestImportOfARowWhoseLinkNoLongerRedirectsFailsIt(t *testing.T) {
	gw := startGateway(t, nil)
	tn := newTenant(t, gw, "free")
	c := newClient(t, gw, tn.key)
	alias, long := tn.id+"-gone", "https://example.com/gone"
	if r := c.do("POST", "/v1/links", fmt.Sprintf(`{"longUrl":%q,"customAlias":%q}`, long, alias)); r.code != http.StatusCreated {
		t.Fatalf("create: %s", r)
	}
	if r := c.do("PATCH", "/v1/links/"+alias, `{"disabled":true}`); r.code != http.StatusOK {
		t.Fatalf("disable: %s", r)
	}
	file := fmt.Sprintf("keyword,url,title,timestamp,ip,clicks\n%s,%s,Gone,2012-05-01 10:00:00,127.0.0.1,7\n", alias, long)
	csvType := []string{"Content-Type", "", "Content-Type", "text/csv"}

	var got importAnswer
	decodeAnswer(t, c.do("POST", "/v1/links:import", file, csvType...), http.StatusOK, &got)
	want := fmt.Sprintf("the alias %q is taken by your link to this URL, which no longer redirects (disabled): enable it, or use another alias", alias)
	if got.Existing != 0 || got.Created != 0 || got.Failed != 1 || len(got.Results) != 1 {
		t.Fatalf("import: %+v; want its one row failed", got)
	}
	if r := got.Results[0]; r.Existing || r.Code != "" || r.Error == nil || r.Error.Code != "FAILED_PRECONDITION" || r.Error.Field != "custom_alias" || r.Error.Message != want {
		t.Errorf("the row: %+v, error %+v; want FAILED_PRECONDITION on custom_alias: %s", r, r.Error, want)
	}

	if r := c.do("PATCH", "/v1/links/"+alias, `{"disabled":false}`); r.code != http.StatusOK {
		t.Fatalf("enable: %s", r)
	}
	var again importAnswer
	decodeAnswer(t, c.do("POST", "/v1/links:import", file, csvType...), http.StatusOK, &again)
	if again.Existing != 1 || again.Failed != 0 || !again.Results[0].Existing || again.Results[0].Code != alias {
		t.Errorf("import once the link is enabled: %+v; want the row existing", again)
	}
}

// Codes from the URL over REST: the first create answers 201 Created, a
// repeat of the same URL (written otherwise) 200 OK with the same link,
// unchanged; the batch marks which items it created.
func TestCreateFromURL(t *testing.T) {
	gw := startGateway(t, nil)
	c := newClient(t, gw, newTenant(t, gw, "free").key)
	var first, again apiLink
	decodeAnswer(t, c.do("POST", "/v1/links", `{"longUrl": "https://example.com/from-url", "mode": "CODE_MODE_FROM_URL", "tags": ["one"]}`), http.StatusCreated, &first)
	decodeAnswer(t, c.do("POST", "/v1/links", `{"longUrl": "HTTPS://Example.com/from-url", "mode": "CODE_MODE_FROM_URL", "tags": ["two"]}`), http.StatusOK, &again)
	if again.Code != first.Code || !slices.Equal(again.Tags, []string{"one"}) {
		t.Errorf("the repeat answered %+v, want the first link %+v unchanged", again, first)
	}
	var batch batchAnswer
	decodeAnswer(t, c.do("POST", "/v1/links:batch", `{"requests": [
		{"longUrl": "https://example.com/from-url", "mode": "CODE_MODE_FROM_URL"},
		{"longUrl": "https://example.com/from-url-2", "mode": "CODE_MODE_FROM_URL"}]}`), http.StatusOK, &batch)
	if len(batch.Results) != 2 || batch.Created != 1 || batch.Results[0].Created || batch.Results[0].Link.Code != first.Code || !batch.Results[1].Created {
		t.Errorf("batch: %+v; want the existing link (created false) and a new one", batch)
	}
}
