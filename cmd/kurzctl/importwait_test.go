package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
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
				w.Header().Set("Content-Type", "application/problem+json")
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusTooManyRequests)
				w.Write([]byte(`{"status":429,"code":"RESOURCE_EXHAUSTED","detail":"rate limit exceeded","retryAfterMs":20,"reason":"RATE_LIMITED"}`))
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
}

// A batch refused by the tenant's quota stops the import, and the rows of
// that batch an earlier run made are reported as such (looked up), as the
// gateway's own import route reports them.
func TestImportStoppedByTheQuotaReportsEarlierRows(t *testing.T) {
	var lookups atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1/links:batch":
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write([]byte(`{"status":429,"code":"RESOURCE_EXHAUSTED","detail":"too many links created","retryAfterMs":30000,"reason":"RATE_LIMITED",` +
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

// importAgainst runs `kurzctl links import` of a file holding csv against
// the fake gateway srv, which it closes when the test ends.
func importAgainst(t *testing.T, srv *httptest.Server, csv string) result {
	t.Helper()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	file := filepath.Join(dir, "yourls.csv")
	if err := os.WriteFile(file, []byte(csv), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(dir, "config.yaml")}}
	return c.run("--url", srv.URL, "--api-key", "k1", "links", "import", file)
}
