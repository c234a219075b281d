package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// What the gateway sends reaches a terminal with every character a
// terminal acts on escaped, JSON-compatibly; text, newlines and tabs
// pass, also when a write splits a character.
func TestTerminalSafeEscapesControls(t *testing.T) {
	for in, want := range map[string]string{
		"code\tabc\n":                              "code\tabc\n",
		"\x1b]0;PWNED\x07\x1b[2J":                  `\u001b]0;PWNED\u0007\u001b[2J`,
		"a\u009b31mRED.example":                    `a\u009b31mRED.example`,
		"evil\u202emoc.example":                    `evil\u202emoc.example`,
		"caf\u00e9 \u65e5\u672c \U0001F600":        "caf\u00e9 \u65e5\u672c \U0001F600",
		"bad\xffbyte\x7f":                          `bad\ufffdbyte\u007f`,
		`{"longUrl":"https://x/` + "\u009b" + `"}`: `{"longUrl":"https://x/\u009b"}`,
	} {
		var out bytes.Buffer
		w := &terminalSafe{w: &out}
		b := []byte(in)
		for i := range b { // one byte a write: runes split across writes
			if n, err := w.Write(b[i : i+1]); n != 1 || err != nil {
				t.Fatalf("Write: %d, %v", n, err)
			}
		}
		if out.String() != want {
			t.Errorf("%q: wrote %q, want %q", in, out.String(), want)
		}
	}
	var out bytes.Buffer
	(&terminalSafe{w: &out}).Write([]byte(`{"host":"a` + "\u009b\u202e" + `b"}`))
	var v map[string]string
	if err := json.Unmarshal(out.Bytes(), &v); err != nil || v["host"] != "a\u009b\u202eb" {
		t.Errorf("escaped JSON %s: %v %q, want the same string back", out.Bytes(), err, v["host"])
	}
}

// An answer larger than kurzctl reads is refused with a clear error, not
// read into memory to its end.
func TestAnswerLargerThanTheBoundIsRefused(t *testing.T) {
	defer func(n int) { maxAnswerBody = n }(maxAnswerBody)
	maxAnswerBody = 1 << 10
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"code":"` + strings.Repeat("A", 4<<10) + `"}`))
	}))
	t.Cleanup(srv.Close)
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(t.TempDir(), "config.yaml")}}
	r := c.run("--url", srv.URL, "--api-key", "k", "links", "get", "abc1234")
	if r.code != exitError || !strings.Contains(r.stderr, "the answer is larger than") {
		t.Errorf("a 4 KiB answer over a 1 KiB bound: %s", r)
	}
}

// A gateway's redirect is not followed: net/http would send the key to
// another port of the same host, and re-send a body (a link's password).
func TestRedirectIsNotFollowed(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { elsewhere.Add(1) }))
	t.Cleanup(other.Close)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(srv.Close)
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(t.TempDir(), "config.yaml")}}
	for _, args := range [][]string{
		{"--api-key", "k", "links", "get", "abc1234"},
		{"--admin-token", "admin-token-0123456789", "tenants", "get", "acme"},
	} {
		r := c.run(append([]string{"--url", srv.URL}, args...)...)
		if r.code != exitError || !strings.Contains(r.stderr, "HTTP 307") {
			t.Errorf("kurzctl %s against a redirect: %s", strings.Join(args, " "), r)
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the redirect's target got %d requests, want none", n)
	}
}

// links list --all stops when the gateway repeats a page token, and at
// maxListBody of answers, instead of reading forever.
func TestListAllStopsAtALoopingGateway(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		token := "again"
		if r.URL.Query().Get("fresh") != "" || r.Header.Get("X-Fresh") != "" {
			token = fmt.Sprint(n)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"links":[{"code":"c%d","longUrl":"https://example.com/%s"}],"nextPageToken":%q}`, n, strings.Repeat("a", 200), token)
	}))
	t.Cleanup(srv.Close)
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(t.TempDir(), "config.yaml")}}
	r := c.run("--url", srv.URL, "--api-key", "k", "links", "list", "--all")
	if r.code != exitError || !strings.Contains(r.stderr, `page token "again" a second time`) || calls.Load() != 2 {
		t.Errorf("a gateway repeating its page token, %d calls: %s", calls.Load(), r)
	}

	// Fresh tokens forever: the bound on the answers in all stops it.
	defer func(n int) { maxListBody = n }(maxListBody)
	maxListBody = 10 << 10
	fresh := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set("X-Fresh", "1")
		srv.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(fresh.Close)
	calls.Store(0)
	r = c.run("--url", fresh.URL, "--api-key", "k", "links", "list", "--all")
	if r.code != exitError || !strings.Contains(r.stderr, "use links export") || calls.Load() > 100 {
		t.Errorf("a gateway with endless pages, %d calls: %s", calls.Load(), r)
	}
}

// links list --all stops at an empty page that names a next page, and
// after maxListPages pages, rather than asking a gateway that sends fresh
// tokens forever: pages of tens of bytes would take millions of requests
// to reach maxListBody.
func TestListAllStopsAtEndlessSmallPages(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("tag") == "empty" {
			fmt.Fprintf(w, `{"links":[],"nextPageToken":"t%d"}`, n)
			return
		}
		fmt.Fprintf(w, `{"links":[{"code":"c%d","longUrl":"https://example.com/"}],"nextPageToken":"t%d"}`, n, n)
	}))
	t.Cleanup(srv.Close)
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(t.TempDir(), "config.yaml")}}
	r := c.run("--url", srv.URL, "--api-key", "k", "links", "list", "--all", "--tag", "empty")
	if r.code != exitError || !strings.Contains(r.stderr, "empty page with a next page token") || calls.Load() != 1 {
		t.Errorf("a gateway of empty pages with fresh tokens, %d calls: %s", calls.Load(), r)
	}

	defer func(n int) { maxListPages = n }(maxListPages)
	maxListPages = 50
	calls.Store(0)
	r = c.run("--url", srv.URL, "--api-key", "k", "links", "list", "--all")
	if r.code != exitError || !strings.Contains(r.stderr, "more than 50 pages") || calls.Load() != 50 {
		t.Errorf("a gateway of one-link pages with fresh tokens, %d calls: %s", calls.Load(), r)
	}
}

// links export stops at --max-size, leaving no file behind; an export of
// exactly the bound passes.
func TestExportStopsAtMaxSize(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/csv")
		if r.URL.Query().Get("tag") == "small" {
			w.Write([]byte(strings.Repeat("x", 1000)))
			return
		}
		row := []byte(strings.Repeat("y", 1023) + "\n")
		for r.Context().Err() == nil {
			if _, err := w.Write(row); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(dir, "config.yaml")}}
	out := filepath.Join(dir, "links.csv")
	r := c.run("--url", srv.URL, "--api-key", "k", "links", "export", "-f", out, "--max-size", "1000000")
	if r.code != exitError || !strings.Contains(r.stderr, "larger than --max-size") {
		t.Errorf("an endless export: %s", r)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("files left after a refused export: %v", entries)
	}
	r = c.run("--url", srv.URL, "--api-key", "k", "links", "export", "--tag", "small", "--max-size", "1000")
	if r.code != 0 || len(r.stdout) != 1000 {
		t.Errorf("an export of exactly --max-size: %d bytes, %s", len(r.stdout), r)
	}
}

// links export streams a tenant's every link: --timeout bounds each pause
// of the answer, not the whole transfer. An export that keeps arriving for
// three times --timeout is written in full; one that stops is cut after
// --timeout, saying so, and leaves no file.
func TestExportTimeoutBoundsPausesNotTheTransfer(t *testing.T) {
	const rows = 40
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/csv")
		flush := http.NewResponseController(w).Flush
		for i := range rows {
			fmt.Fprintf(w, "row %d\n", i)
			_ = flush()
			if r.URL.Query().Get("tag") == "stalls" && i == 2 {
				<-r.Context().Done() // sends nothing more
				return
			}
			// A slow gateway, the fault under test: 40 rows 50 ms apart
			// take 2 s, three times the --timeout below, each pause a
			// fourteenth of it.
			time.Sleep(50 * time.Millisecond)
		}
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	c := &ctl{t: t, env: map[string]string{"KURZ_CONFIG": filepath.Join(dir, "config.yaml")}}
	out := filepath.Join(dir, "links.csv")
	start := time.Now()
	r := c.run("--url", srv.URL, "--api-key", "k", "--timeout", "700ms", "links", "export", "-f", out)
	if r.code != 0 {
		t.Fatalf("an export arriving for %v with --timeout 700ms: %s", time.Since(start), r)
	}
	if b, err := os.ReadFile(out); err != nil || strings.Count(string(b), "\n") != rows {
		t.Fatalf("export -f: %v, want %d rows:\n%s", err, rows, b)
	}
	stalled := filepath.Join(dir, "stalled.csv")
	r = c.run("--url", srv.URL, "--api-key", "k", "--timeout", "700ms", "links", "export", "--tag", "stalls", "-f", stalled)
	if r.code != exitError || !strings.Contains(r.stderr, "sent nothing for 700ms (--timeout)") {
		t.Errorf("an export that stops sending: %s", r)
	}
	if _, err := os.Stat(stalled); !os.IsNotExist(err) {
		t.Errorf("a stalled export left %s: %v", stalled, err)
	}
}
