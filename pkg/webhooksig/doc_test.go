package webhooksig

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/testkit/mdblock"
	"kurz.dev/pkg/testkit/servertest"
)

// docPath is the user's guide whose recipes these tests run.
const docPath = "../../docs/webhooks.md"

// docBlock returns the only fenced block of lang in docs/webhooks.md's
// "Verifying the signature" section.
func docBlock(t *testing.T, lang string) string {
	t.Helper()
	blocks := mdblock.In(mdblock.Read(t, docPath), "## Verifying the signature", lang)
	if len(blocks) != 1 {
		t.Fatalf("docs/webhooks.md's \"## Verifying the signature\" section has %d ```%s blocks, want 1", len(blocks), lang)
	}
	return blocks[0].Code
}

// TestDocsShellRecipe runs the shell recipe on a body signed now (valid),
// a tampered body and a stale signature (both invalid).
func TestDocsShellRecipe(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatalf("the shell recipe needs openssl: %v", err)
	}
	script := docBlock(t, "sh")
	const secret = "whsec_docs-test-secret"
	body := []byte(`{"id":"evt_1","type":"link.created","data":{"long_url":"https://example.com/a b"}}`)
	now := time.Now()
	for name, tc := range map[string]struct {
		header string
		body   []byte
		want   string
	}{
		"signed now":      {Sign(secret, now, body), body, "valid"},
		"tampered body":   {Sign(secret, now, body), append(bytes.Clone(body), ' '), "invalid"},
		"stale signature": {Sign(secret, now.Add(-10*time.Minute), body), body, "invalid"},
		"other secret":    {Sign("whsec_other", now, body), body, "invalid"},
		// A forged header: bash ran the subscript's command while
		// computing the signature's age, before comparing anything.
		"command in t":    {"t=x[$(touch PWNED)],v1=00", body, "invalid"},
		"expression in t": {"t=now-1,v1=00", body, "invalid"},
		"no t":            {"v1=00", body, "invalid"},
		"leading zero":    {"t=0" + strconv.FormatInt(now.Unix(), 10) + ",v1=00", body, "invalid"},
		"empty header":    {"", body, "invalid"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "body.json"), tc.body, 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("bash", "-c", script)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "HEADER="+tc.header, "SECRET="+secret)
			out, err := cmd.CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != tc.want {
				t.Fatalf("the recipe printed %q (%v), want %q", out, err, tc.want)
			}
			if _, err := os.Stat(filepath.Join(dir, "PWNED")); err == nil {
				t.Fatal("the recipe ran a command the header held")
			}
		})
	}
}

// TestDocsGoRecipe builds the Go receiver of the guide and sends it a
// signed delivery (accepted, twice: the second is deduped, still 2xx), a
// tampered one and a stale one (both 400).
func TestDocsGoRecipe(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{"main.go": docBlock(t, "go"), "go.mod": "module receiver\n\ngo 1.22\n"}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "receiver")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of the recipe: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	const secret = "whsec_docs-test-secret"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := exec.CommandContext(ctx, bin)
	run.Env = append(os.Environ(), "ADDR="+addr, "KURZ_WEBHOOK_SECRET="+secret)
	var logs bytes.Buffer
	run.Stdout, run.Stderr = &logs, &logs
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	// stop ends the receiver; its output is complete (and safe to read)
	// once Wait has returned.
	stopped := false
	stop := func() string {
		if !stopped {
			stopped = true
			cancel()
			_ = run.Wait()
		}
		return logs.String()
	}
	defer stop()

	post := func(header string, body []byte) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/kurz", bytes.NewReader(body))
		req.Header.Set(Header, header)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	body := []byte(`{"id":"evt_docs","type":"link.created","tenant":"acme","data":{}}`)
	if !servertest.Eventually(10*time.Second, func() bool { return post("", nil) != 0 }) {
		t.Fatalf("the recipe's receiver does not listen on %s:\n%s", addr, stop())
	}
	now := time.Now()
	for i, tc := range []struct {
		header string
		body   []byte
		want   int
	}{
		{Sign(secret, now, body), body, http.StatusNoContent},
		{Sign(secret, now, body), body, http.StatusNoContent}, // a retry
		{Sign(secret, now, body), bytes.Replace(body, []byte("acme"), []byte("evil"), 1), http.StatusBadRequest},
		{Sign(secret, now.Add(-10*time.Minute), body), body, http.StatusBadRequest},
		{"t=1,v1=zz", body, http.StatusBadRequest},
		// Signed with two secrets, as a rotation would (Verify takes any
		// v1 that matches): this receiver's secret first, then the other.
		{Sign(secret, now, body) + ",v1=" + strings.Repeat("0", 64), body, http.StatusNoContent},
	} {
		if got := post(tc.header, tc.body); got != tc.want {
			t.Errorf("delivery %d: %d, want %d", i, got, tc.want)
		}
	}
	out := stop()
	if n := strings.Count(out, "link.created evt_docs"); n != 1 {
		t.Errorf("the receiver handled evt_docs %d times, want once:\n%s", n, out)
	}
}
