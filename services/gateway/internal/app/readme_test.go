//go:build integration

package app

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/testkit/mdblock"
	"kurz.dev/services/gateway/gatewaytest"
)

// The README's "Your first link", the "Using the API" section of
// docs/api.md that goes on from it, and docs/webhooks.md's "Subscribing",
// run verbatim: their ```sh blocks in
// order, in one bash, against a test gateway whose limiter has the rules
// in PostgreSQL (the bootstrap's, as under make up). Only the variables the
// README documents differ (KURZ, KURZ_GATEWAY_ADMIN_TOKEN, TENANT). Each
// block's output is compared with the block that follows it, with the
// test's values read back as the documents' (the gateway's address, the
// tenant "acme"); "…" there matches whatever changes from run to run.
func TestREADMEExamples(t *testing.T) {
	blocks := readmeBlocks(t)
	gw := startGateway(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": stack.LimiterPG.GRPCAddr})
	tenantID := newTenantID(t)
	cleanupTenants(t, tenantID)
	start := time.Now()
	t.Cleanup(func() {
		_, _ = stack.DB.Exec(context.Background(),
			`DELETE FROM links WHERE tenant = 'anonymous' AND long_url = 'https://example.com/c' AND created_at >= $1`, start.Add(-time.Minute))
	})

	// The README's client is one address behind a proxy the gateway
	// trusts: a fresh IP for this run, so its limits are its own.
	target, _ := url.Parse(gw.HTTP)
	ip := gatewaytest.NewIP()
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(target)
		pr.Out.Header.Set("X-Forwarded-For", ip)
	}}
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rp.ServeHTTP(respelled{w}, r)
	}))
	t.Cleanup(proxy.Close)

	const marker = "@@@ end of block @@@"
	var script strings.Builder
	for _, b := range blocks {
		script.WriteString(b.code)
		script.WriteString("\necho '" + marker + "'\n")
	}
	dir := t.TempDir()
	cmd := exec.Command("bash", "--noprofile", "--norc", "-c", script.String())
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "KURZ="+proxy.URL, "KURZ_GATEWAY_ADMIN_TOKEN="+adminToken, "TENANT="+tenantID, "LC_ALL=C.UTF-8")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, out)
	}
	got := strings.ReplaceAll(string(out), "\r\n", "\n")
	got = strings.NewReplacer(proxy.URL, "http://127.0.0.1:8080", `"`+tenantID+`"`, `"acme"`).Replace(got)
	outputs := strings.Split(got, marker+"\n")
	if len(outputs) != len(blocks)+1 {
		t.Fatalf("%d blocks ran, %d outputs:\n%s", len(blocks), len(outputs)-1, got)
	}
	for i, b := range blocks {
		if !b.hasWant {
			continue
		}
		if problem := gatewaytest.MatchOutput(b.want, outputs[i]); problem != "" {
			t.Errorf("block %d (%s line %d):\n%s\n%s\ngot:\n%s", i+1, b.file, b.line, b.code, problem, outputs[i])
		}
	}
	if t.Failed() {
		return
	}
	if _, err := os.Stat(filepath.Join(dir, "qr.png")); err != nil {
		t.Errorf("the QR example wrote no qr.png: %v", err)
	}
	if r := newClient(t, gw, adminToken).do("GET", "/v1/admin/tenants/"+tenantID, ""); r.code != http.StatusOK || r.json(t)["plan"] != "pro" {
		t.Errorf("the README's tenant afterwards: %s; want it on pro", r)
	}
}

// readmeBlock is one ```sh block of a document and the output block that
// follows it, if any.
type readmeBlock struct {
	code, want string
	hasWant    bool   // an output block follows (want may be empty)
	file       string // the document, from the repository root
	line       int    // the line of its opening fence (1-based)
}

// readmeSections are the sections whose examples the test runs, in order:
// the README's first link, then the API walkthrough that continues it,
// then the webhooks guide's subscription.
var readmeSections = []struct{ file, section string }{
	{"README.md", "## Your first link"},
	{"docs/api.md", "## Using the API"},
	{"docs/webhooks.md", "## Subscribing"},
}

// readmeBlocks reads the ```sh blocks of every readmeSections entry and,
// for each, the fenced block right after it (```json or ```text) as its
// expected output.
func readmeBlocks(t *testing.T) []readmeBlock {
	t.Helper()
	var blocks []readmeBlock
	for _, s := range readmeSections {
		got := sectionBlocks(t, s.file, s.section)
		if len(got) == 0 {
			t.Fatalf("found no sh blocks under %q in %s", s.section, s.file)
		}
		blocks = append(blocks, got...)
	}
	if len(blocks) < 5 {
		t.Fatalf("found %d sh blocks in %v", len(blocks), readmeSections)
	}
	return blocks
}

// sectionBlocks reads the ```sh blocks, with their outputs, of one section
// of a document (a path from the repository root).
func sectionBlocks(t *testing.T, file, section string) []readmeBlock {
	t.Helper()
	var blocks []readmeBlock
	var prev *mdblock.Block // the section's block before b, of any language
	for _, b := range mdblock.Read(t, filepath.Join("..", "..", "..", "..", filepath.FromSlash(file))) {
		if b.Section != section {
			continue
		}
		switch {
		case b.Lang == "sh":
			blocks = append(blocks, readmeBlock{code: b.Code, file: file, line: b.Line})
		case b.Lang == "":
			// A bare block is neither an example nor an output.
		case prev != nil && prev.Lang == "sh" && strings.TrimSpace(b.Before) == "":
			// An output block: it belongs to the sh block just before it,
			// with only blank lines between.
			blocks[len(blocks)-1].want, blocks[len(blocks)-1].hasWant = b.Code, true
		default:
			t.Fatalf("%s line %d: a ```%s block that follows no ```sh block", file, b.Line, b.Lang)
		}
		prev = &b
	}
	return blocks
}

// respelled gives back the gateway's spelling of the field names the README
// shows, which Go's client canonicalises as it reads a response
// ("Ratelimit-Policy"), before the test proxy passes the response on.
type respelled struct{ http.ResponseWriter }

func (w respelled) WriteHeader(code int) {
	h := w.Header()
	for _, name := range []string{"RateLimit", "RateLimit-Policy", "X-Request-ID"} {
		if v, ok := h[http.CanonicalHeaderKey(name)]; ok {
			delete(h, http.CanonicalHeaderKey(name))
			h[name] = v
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w respelled) Unwrap() http.ResponseWriter { return w.ResponseWriter }
