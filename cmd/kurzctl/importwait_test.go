package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
)

// A file sent again looks up the codes an earlier run made, each lookup
// an API call charged to the key's quota: a lookup refused with 429 waits
// its Retry-After and asks again, rather than stopping the import at its
// first rows on every run.
func TestImportLookupWaitsOutRateLimits(t *testing.T) {
	var refused atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1/links:batch":
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"results":[{"index":0,"error":{"code":"ALREADY_EXISTS","field":"custom_alias","message":"taken"}}]}`))
		case r.Method == "GET" && r.URL.Path == "/v1/links/imp0rted":
			if refused.Add(1) <= 2 {
				refuseRateLimited(w)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"code":"imp0rted","shortUrl":"http://k.test/imp0rted","longUrl":"https://example.com/again"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	r := importAgainst(t, srv, "keyword,url\nimp0rted,https://example.com/again\n")
	if r.code != 0 || !strings.Contains(r.stdout+r.stderr, "1 imported before") && !strings.Contains(r.stdout+r.stderr, "existing") {
		t.Fatalf("import with two lookups refused: %s", r)
	}
	if n := refused.Load(); n != 3 {
		t.Errorf("%d lookups, want 3 (two refused, then the link)", n)
	}
	if n := strings.Count(r.stderr, "waiting 20ms: rate limit exceeded\n"); n != 2 {
		t.Errorf("stderr says %d waits, want 2:\n%s", n, r.stderr)
	}
}

// A batch refused with an answer that guarantees nothing of it was created
// (the gateway's rate limit spent by the lookups, another import of the
// tenant holding its bulk share, every bulk slot busy) waits the
// Retry-After, saying so on stderr, and sends the same rows again: the
// import completes, each row created once.
func TestImportBatchWaitsOutRefusalsThatCreatedNothing(t *testing.T) {
	refusals := []struct {
		status int
		body   string
	}{
		{http.StatusTooManyRequests, `{"status":429,"code":"RESOURCE_EXHAUSTED","detail":"rate limit exceeded (policy api/per-api-key); retry after 1s","retryAfterMs":20,"reason":"RATE_LIMITED"}`},
		{http.StatusTooManyRequests, `{"status":429,"code":"RESOURCE_EXHAUSTED","detail":"this tenant's bulk requests (batches, imports) in progress already hold its share of the gateway's bulk slots (1); nothing was created: retry when one is done","retryAfterMs":20,"reason":"BULK_SHARE_IN_USE"}`},
		{http.StatusServiceUnavailable, `{"status":503,"code":"UNAVAILABLE","detail":"the gateway is serving as many bulk requests (batches, imports) as it can hold; nothing was created: retry shortly","retryAfterMs":20,"reason":"BULK_SLOTS_BUSY"}`},
	}
	var posts atomic.Int64
	var mu sync.Mutex
	var created []string // long URLs, in the order created
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || r.URL.Path != "/v1/links:batch" {
			http.NotFound(w, r)
			return
		}
		if n := int(posts.Add(1)); n <= len(refusals) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(refusals[n-1].status)
			w.Write([]byte(refusals[n-1].body))
			return
		}
		var req shortenerv1.BatchCreateLinksRequest
		body, _ := io.ReadAll(r.Body)
		if err := protojson.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp := &shortenerv1.BatchCreateLinksResponse{}
		mu.Lock()
		defer mu.Unlock()
		for i, l := range req.GetRequests() {
			created = append(created, l.GetLongUrl())
			code := fmt.Sprintf("s%d", len(created))
			resp.Results = append(resp.Results, &shortenerv1.BatchCreateResult{Index: int32(i), Created: true,
				Link: &shortenerv1.Link{Code: code, ShortUrl: "http://k.test/" + code, LongUrl: l.GetLongUrl()}})
		}
		out, _ := protojson.Marshal(resp)
		w.Header().Set("Content-Type", "application/json")
		w.Write(out)
	}))
	r := importAgainst(t, srv, "keyword,url\n,https://example.com/a\n,https://example.com/b\n")
	if r.code != 0 || !strings.Contains(r.stdout, "2 created") {
		t.Fatalf("import whose batch was refused three times: %s; want it completed", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"https://example.com/a", "https://example.com/b"}; !slices.Equal(created, want) {
		t.Errorf("created %q, want %q once each", created, want)
	}
	for _, line := range []string{
		"waiting 20ms: rate limit exceeded (policy api/per-api-key)",
		"waiting 20ms: this tenant's bulk requests",
		"waiting 20ms: the gateway is serving as many bulk requests",
	} {
		if !strings.Contains(r.stderr, line) {
			t.Errorf("stderr lacks %q:\n%s", line, r.stderr)
		}
	}
}

// A 503 that does not say nothing was created (the gateway's timeout of
// the shortener's call) may come after links were made: the batch is not
// sent again, though the answer has a Retry-After, or rows without an
// alias would be created twice.
func TestImportBatchIsNotSentAgainAfterAnUnknownOutcome(t *testing.T) {
	var posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"status":503,"code":"UNAVAILABLE","detail":"the request took too long; try again","retryAfterMs":20}`))
	}))
	r := importAgainst(t, srv, "keyword,url\n,https://example.com/a\n")
	if r.code == 0 || !strings.Contains(r.stderr, "took too long") || strings.Contains(r.stderr, "waiting") {
		t.Errorf("import whose batch timed out at the gateway: %s; want it stopped without a wait", r)
	}
	if n := posts.Load(); n != 1 {
		t.Errorf("the batch was sent %d times, want once", n)
	}
}

// A batch refused by the tenant's quota for longer than an import waits
// (a daily quota's two hours) stops the import, and the rows of
// that batch an earlier run made are reported as such (looked up), as the
// gateway's own import route reports them.
func TestImportStoppedByTheQuotaReportsEarlierRows(t *testing.T) {
	var lookups atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1/links:batch":
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "7200")
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write([]byte(`{"status":429,"code":"RESOURCE_EXHAUSTED","detail":"too many links created","retryAfterMs":7200000,"reason":"RATE_LIMITED",` +
				`"details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"RATE_LIMITED","domain":"kurz.dev"}]}`))
		case r.Method == "GET" && r.URL.Path == "/v1/links/imp0rted":
			lookups.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"code":"imp0rted","shortUrl":"http://k.test/imp0rted","longUrl":"https://example.com/again"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	r := importAgainst(t, srv, "keyword,url\nimp0rted,https://example.com/again\nfresh123,https://example.com/new\n")
	if r.code == 0 || !strings.Contains(r.stderr, "too many links created") || !strings.Contains(r.stderr+r.stdout, "1 imported before") {
		t.Errorf("import stopped by the quota: %s; want it stopped, the quota named and the earlier row reported", r)
	}
	if n := lookups.Load(); n != 1 {
		t.Errorf("%d lookups of the earlier row, want 1", n)
	}
}

// importAgainst runs `kurzctl links import` of a file holding csv, with
// flags, against the fake gateway srv, which it closes when the test ends.
func importAgainst(t *testing.T, srv *httptest.Server, csv string, flags ...string) result {
	t.Helper()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	file := filepath.Join(dir, "yourls.csv")
	if err := os.WriteFile(file, []byte(csv), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(dir, "config.yaml")}}
	return c.run(append([]string{"--url", srv.URL, "--api-key", "k1", "links", "import", file}, flags...)...)
}

// An import that went through its file but whose rows failed exits 3, not
// 0, with the report on stdout (in -o json too): a script learns that
// rows got no link without reading the report.
func TestImportWithFailedRowsExitsThree(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || r.URL.Path != "/v1/links:batch" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"results":[{"index":0,"error":{"code":"INVALID_ARGUMENT","field":"long_url","message":"blocked"}}]}`))
	}))
	r := importAgainst(t, srv, "keyword,url\n,https://example.com/a\nnourl1,\n")
	if r.code != exitRowsFailed || !strings.Contains(r.stdout, "0 created (0 kept their code), 2 failed") ||
		!strings.Contains(r.stderr, "2 of 2 rows got no link") {
		t.Errorf("import whose every row failed: %s; want exit %d with the report", r, exitRowsFailed)
	}
	r = importAgainst(t, srv, "keyword,url\n,https://example.com/a\n", "-o", "json")
	var rep importReportJSON
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.code != exitRowsFailed || rep.Failed != 1 || rep.Stopped != "" {
		t.Errorf("import -o json whose row failed: %v, %+v; %s", err, rep, r)
	}
}

// An import that stops early still writes its -o json report: the codes
// the rows before the stop got, and why it stopped.
func TestImportStoppedWritesThePartialJSONReport(t *testing.T) {
	var posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || r.URL.Path != "/v1/links:batch" {
			http.NotFound(w, r)
			return
		}
		if posts.Add(1) > 1 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusInternalServerError)
			w.Write([]byte(`{"status":500,"code":"INTERNAL","detail":"internal error; try again later"}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"results":[{"index":0,"link":{"code":"s1","shortUrl":"http://k.test/s1","longUrl":"https://example.com/a"},"created":true}]}`))
	}))
	r := importAgainst(t, srv, "keyword,url\n,https://example.com/a\n,https://example.com/b\n", "--batch", "1", "-o", "json")
	var rep importReportJSON
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("import stopped at its second batch wrote no JSON report: %v; %s", err, r)
	}
	if r.code != exitError || rep.Rows != 2 || rep.Created != 1 || len(rep.Results) != 1 || rep.Results[0].Code != "s1" ||
		!strings.Contains(rep.Stopped, "batch create of lines 3 to 3: internal error") {
		t.Errorf("import stopped at its second batch: %+v; %s", rep, r)
	}
}

// links list --clicks waits out a clickCounts call the rate limit refuses
// (charged per 100 links, a few pages spend a free key's burst) and asks
// again, rather than failing after every page was read; any other refusal
// fails the command at once.
func TestListClicksWaitsOutRateLimits(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == "GET" && r.URL.Path == "/v1/links":
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"links":[{"code":"c1ick5","shortUrl":"http://k.test/c1ick5","longUrl":"https://example.com/","createTime":"2026-01-01T00:00:00Z"}]}`))
		case r.Method == "POST" && r.URL.Path == "/v1/links:clickCounts":
			if calls.Add(1) <= 2 {
				refuseRateLimited(w)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"links":[{"code":"c1ick5","counts":{"total":"42"}}]}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(t.TempDir(), "config.yaml")}}
	r := c.run("--url", srv.URL, "--api-key", "k1", "links", "list", "--clicks")
	if r.code != 0 || !strings.Contains(r.stdout, "42") {
		t.Fatalf("list --clicks with two counts refused: %s", r)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("%d clickCounts calls, want 3 (two refused, then the counts)", n)
	}
	if n := strings.Count(r.stderr, "waiting 20ms: rate limit exceeded\n"); n != 2 {
		t.Errorf("stderr says %d waits, want 2:\n%s", n, r.stderr)
	}
}

// links list --clicks counts its waits over the whole list, as --all
// does, so that a long list's total wait is bounded: two calls of counts
// (1,001 links) each refused fewer times than the bound, but more in
// all, stop the command.
func TestListClicksBoundsWaitsOverTheList(t *testing.T) {
	var refused atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == "GET" && r.URL.Path == "/v1/links":
			tok := r.URL.Query().Get("page_token")
			n, next := maxClickCountsLinks, "p2"
			if tok != "" {
				n, next = 1, ""
			}
			links := make([]string, n)
			for i := range links {
				links[i] = fmt.Sprintf(`{"code":"c%s%d","shortUrl":"http://k.test/c","longUrl":"https://example.com/","createTime":"2026-01-01T00:00:00Z"}`, tok, i)
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"links":[%s],"nextPageToken":%q}`, strings.Join(links, ","), next)
		case r.Method == "POST" && r.URL.Path == "/v1/links:clickCounts":
			if refused.Add(1) <= maxImportWaits*2/3+1 { // two calls' refusals add up past the bound
				refuseRateLimited(w)
				return
			}
			refused.Store(0) // the next call refused as many times anew
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"links":[]}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(t.TempDir(), "config.yaml")}}
	r := c.run("--url", srv.URL, "--api-key", "k1", "links", "list", "--all", "--clicks")
	if r.code == 0 || !strings.Contains(r.stderr, "rate limit exceeded") {
		t.Fatalf("list --clicks refused past the bound in all: exit %d; want it to stop with the refusal; stderr:\n%s", r.code, r.stderr)
	}
	if n := strings.Count(r.stderr, "waiting 20ms: rate limit exceeded\n"); n != maxImportWaits {
		t.Errorf("stderr says %d waits, want %d (the bound over the whole list):\n%s", n, maxImportWaits, r.stderr)
	}
}

// refuseRateLimited answers the gateway's 429 of a spent rate limit, to
// retry after 20 ms.
func refuseRateLimited(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Retry-After", "1")
	w.WriteHeader(http.StatusTooManyRequests)
	w.Write([]byte(`{"status":429,"code":"RESOURCE_EXHAUSTED","detail":"rate limit exceeded","retryAfterMs":20,"reason":"RATE_LIMITED"}`))
}

// links list --all waits out a page the rate limit refuses (a free key's
// pages spend its list rule) and asks for it again, as --clicks does,
// rather than failing after the pages already read; the waits are counted
// over the whole list, so that its total wait is bounded: pages each
// refused fewer times than the bound, but more in all, stop the list.
func TestListAllWaitsOutRateLimits(t *testing.T) {
	serve := func(refusals int64) (*httptest.Server, *atomic.Int64) {
		var refused atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != "GET" || r.URL.Path != "/v1/links" {
				http.NotFound(w, r)
				return
			}
			tok := r.URL.Query().Get("page_token")
			if tok != "" && refused.Add(1) <= refusals {
				refuseRateLimited(w)
				return
			}
			refused.Store(0) // each later page refused as many times anew
			next := map[string]string{"": "p2", "p2": "p3", "p3": ""}[tok]
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"links":[{"code":"c0de%s","shortUrl":"http://k.test/c","longUrl":"https://example.com/"}],"nextPageToken":%q}`, tok, next)
		}))
		t.Cleanup(srv.Close)
		return srv, &refused
	}
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(t.TempDir(), "config.yaml")}}

	srv, _ := serve(2)
	r := c.run("--url", srv.URL, "--api-key", "k1", "links", "list", "--all")
	if r.code != 0 || !strings.Contains(r.stdout, "c0dep2") || !strings.Contains(r.stdout, "c0dep3") {
		t.Fatalf("list --all with pages 2 and 3 refused twice each: %s", r)
	}
	if n := strings.Count(r.stderr, "waiting 20ms: rate limit exceeded\n"); n != 4 {
		t.Errorf("stderr says %d waits, want 4:\n%s", n, r.stderr)
	}

	srv, _ = serve(maxImportWaits*2/3 + 1) // two pages' refusals add up past the bound
	r = c.run("--url", srv.URL, "--api-key", "k1", "links", "list", "--all")
	if r.code == 0 || !strings.Contains(r.stderr, "rate limit exceeded") {
		t.Fatalf("list --all refused past the bound in all: %s; want it to stop with the refusal", r)
	}
	if n := strings.Count(r.stderr, "waiting 20ms: rate limit exceeded\n"); n != maxImportWaits {
		t.Errorf("stderr says %d waits, want %d (the bound over the whole list):\n%s", n, maxImportWaits, r.stderr)
	}
}
