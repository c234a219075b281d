//go:build integration

package console_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/geoip/geoiptest"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/gateway/gatewaytest"
	"kurz.dev/services/gateway/internal/app"
)

// adminToken is the test gateway's admin credential.
const adminToken = "console-test-admin-token-0123456789"

// User agents of the clicks: a desktop browser (a human) and a link
// preview fetcher (a bot).
const (
	humanUA = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
	botUA   = "Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)"
)

// The console in headless Chromium against the real services: a wrong API
// key shows the API's message; the right one signs in (kept in
// sessionStorage only); a link created through the form is listed with its
// short URL; its QR code loads from a blob: URL; an edit through the same
// form changes its target; a human click and a bot click through the
// redirect reach the stats page (refreshed until the consumer has stored
// them), in the chart's data attributes and the tables; revoking asks first
// and then removes the link; the stats show the clicks' countries. The page throws no exception and the CSP
// blocks nothing. A screenshot of the stats page goes to the artifacts
// directory (and docs/ with KURZ_UPDATE_SCREENSHOT=1).
func TestConsoleInBrowser(t *testing.T) {
	s := startStack(t)
	gw := startGateway(t, s)
	_, key := newTenant(t, s, gw)
	b := startBrowser(t)
	ctx, do, eval, text := b.ctx, b.do, b.eval, b.text

	// A wrong key: the API's own message, and nothing stored.
	start := time.Now()
	wrongKey := "kurz_" + strings.Repeat("x", 12) + "_" + strings.Repeat("y", 32)
	do("sign in with a wrong key",
		chromedp.Navigate(gw.HTTP+"/console"),
		chromedp.WaitVisible(chromedp.CSS("#signin-key")),
		chromedp.SendKeys(chromedp.CSS("#signin-key"), wrongKey),
		chromedp.Click(chromedp.CSS("#signin-submit")),
		chromedp.WaitVisible(chromedp.CSS("#signin-error")))
	if got, want := text("#signin-error"), "the API key is invalid or revoked"; got != want {
		t.Errorf("sign-in error with a wrong key: %q, want the API's message %q", got, want)
	}
	if got := eval(`sessionStorage.getItem('kurz.apiKey') || ''`); got != "" {
		t.Errorf("a wrong key was stored: %q", got)
	}

	// The right key: the links view, the key in sessionStorage only.
	do("sign in",
		chromedp.Evaluate[chromedp.Void](`document.getElementById('signin-key').value = ''`),
		chromedp.SendKeys(chromedp.CSS("#signin-key"), key),
		chromedp.Click(chromedp.CSS("#signin-submit")),
		chromedp.WaitVisible(chromedp.CSS("#view-links")))
	if got := eval(`sessionStorage.getItem('kurz.apiKey') || ''`); got != key {
		t.Errorf("sessionStorage holds %q, want the key", got)
	}
	if got := eval(`String(localStorage.length)`); got != "0" {
		t.Errorf("localStorage has %s items, want none (the key stays in the tab)", got)
	}

	// Finished loads of the list, to wait for a reload.
	listed := `document.getElementById('view-links').dataset.renders`

	// Create a link through the form; its short URL is on the page.
	longURL := "https://example.com/console/" + strings.ToLower(rand.Text()[:8])
	do("create a link",
		chromedp.Click(chromedp.CSS("#new-link")),
		chromedp.WaitVisible(chromedp.CSS("#link-dialog")),
		chromedp.SendKeys(chromedp.CSS("#f-long-url"), longURL),
		chromedp.Click(chromedp.CSS("#link-save")),
		chromedp.WaitVisible(chromedp.CSS("#created-short-url")))
	shortURL := text("#created-short-url")
	code := shortURL[strings.LastIndex(shortURL, "/")+1:]
	if !strings.HasPrefix(shortURL, s.redirectURL+"/") || code == "" {
		t.Fatalf("short URL on the page: %q (form error %q), want %s/<code>", shortURL, text("#link-form-error"), s.redirectURL)
	}
	row := fmt.Sprintf(`tr[data-code=%q]`, code)
	do("the new link in the list", chromedp.WaitVisible(chromedp.CSS(row+" a.short")))
	if got := text(row + " .target"); got != longURL {
		t.Errorf("listed target %q, want %q", got, longURL)
	}

	// Its QR code, fetched with the key, shown from a blob: URL.
	do("QR code",
		chromedp.Click(chromedp.CSS(row+" button.qr")),
		chromedp.WaitVisible(chromedp.CSS("#qr-dialog")),
		chromedp.Poll[chromedp.Void](`(() => { const i = document.getElementById('qr-img');
			return i.src.startsWith('blob:') && i.complete && i.naturalWidth > 0; })()`, chromedp.WithPollingTimeout(20*time.Second)))
	if w := eval(`String(document.getElementById('qr-img').naturalWidth)`); w != "256" {
		t.Errorf("QR image naturalWidth %s, want 256", w)
	}
	do("close the QR code", chromedp.Click(chromedp.CSS("#qr-close")), chromedp.WaitNotVisible(chromedp.CSS("#qr-dialog")))

	// Edit the long URL through the same form (a PATCH), with a redirect
	// rule and an A/B variant; the list reloads with it.
	editedURL := longURL + "/edited"
	const (
		promoURL   = "https://example.com/console/promo"
		variantURL = "https://example.com/console/only"
		rulesJSON  = `[{"name": "promo", "conditions": [{"query": {"param": "promo"}}], "url": "` + promoURL + `"}]`
		variants   = "only 1 " + variantURL
	)
	n := eval(listed)
	do("edit the link",
		chromedp.Click(chromedp.CSS(row+" button.edit")),
		chromedp.WaitVisible(chromedp.CSS("#link-dialog")),
		chromedp.Evaluate[chromedp.Void](`document.getElementById('f-long-url').value = ''`),
		chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.getElementById('f-rules').value = %q;
			document.getElementById('f-variants').value = %q`, rulesJSON, variants)),
		chromedp.SendKeys(chromedp.CSS("#f-long-url"), editedURL),
		chromedp.Click(chromedp.CSS("#link-save")),
		chromedp.WaitNotVisible(chromedp.CSS("#link-dialog")),
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`Number(%s) > %s`, listed, n), chromedp.WithPollingTimeout(20*time.Second)))
	if got := text(row + " .target"); got != editedURL {
		t.Errorf("listed target after the edit %q (form error %q), want %q", got, text("#link-form-error"), editedURL)
	}
	longURL = editedURL
	// The form shows the rule and the variant again, as stored.
	do("reopen the form",
		chromedp.Click(chromedp.CSS(row+" button.edit")),
		chromedp.WaitVisible(chromedp.CSS("#link-dialog")))
	if got := eval(`document.getElementById('f-variants').value`); got != variants {
		t.Errorf("variants in the form: %q, want %q", got, variants)
	}
	if got := eval(`JSON.stringify(JSON.parse(document.getElementById('f-rules').value))`); !strings.Contains(got, `"name":"promo"`) || !strings.Contains(got, promoURL) {
		t.Errorf("rules in the form: %s", got)
	}
	// A list that is not JSON is refused in the page, nothing sent.
	do("a malformed rule",
		chromedp.Evaluate[chromedp.Void](`document.getElementById('f-rules').value = '[{'`),
		chromedp.Click(chromedp.CSS("#link-save")),
		chromedp.Poll[chromedp.Void](`document.getElementById('link-form-error').textContent.startsWith('Rules: not JSON')`, chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Click(chromedp.CSS("#link-cancel")),
		chromedp.WaitNotVisible(chromedp.CSS("#link-dialog")))

	// A human (in Germany, says the redirect's fixture GeoIP database)
	// opens the short URL and gets the variant (no rule matches); another
	// (somewhere it does not know) opens it with ?promo and gets the
	// rule's URL; a bot opens it too. Breakdowns count humans only.
	for _, c := range []struct{ ua, referer, ip, query, want string }{
		{humanUA, "https://news.example/console", geoiptest.IPv4DE, "", variantURL},
		{humanUA, "", geoiptest.IPv4Unknown, "?promo", promoURL},
		{botUA, "", geoiptest.IPv4DE, "?promo", promoURL},
	} {
		if st, loc := visit(t, shortURL+c.query, c.ua, c.referer, c.ip); st != http.StatusFound || loc != c.want {
			t.Fatalf("GET %s%s as %q: %d Location %q, want 302 to %s", shortURL, c.query, c.ua, st, loc, c.want)
		}
	}

	// The stats page, refreshed until the three clicks are in ClickHouse.
	do("open the stats page", chromedp.Click(chromedp.CSS(row+" a.stats")), chromedp.WaitVisible(chromedp.CSS("#view-stats")))
	renders := `document.getElementById('view-stats').dataset.renders`
	deadline := time.Now().Add(90 * time.Second)
	for {
		n := eval(renders)
		do("refresh the stats", chromedp.Click(chromedp.CSS("#stats-refresh")),
			chromedp.Poll[chromedp.Void](fmt.Sprintf(`Number(%s) > %s`, renders, n), chromedp.WithPollingTimeout(20*time.Second)))
		got := eval(`(() => { const c = document.querySelector('#chart svg');
			return c ? c.dataset.human + '/' + c.dataset.bot + '/' + c.dataset.flood : 'no chart'; })()`)
		if got == "2/1/0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the chart shows human/bot/flood %s (stats error %q), want 2/1/0", got, text("#stats-error"))
		}
		time.Sleep(300 * time.Millisecond) // the poll interval of a person pressing Refresh
	}
	if n := eval(`String(document.querySelectorAll('#chart g.bucket[data-human="2"]').length)`); n != "1" {
		t.Errorf("%s buckets of the chart hold the human clicks, want 1", n)
	}
	if n := eval(`String(document.querySelectorAll('#chart g.bucket rect').length)`); n != "2" {
		t.Errorf("%s bars drawn, want 2 (one human, one bot)", n)
	}
	if n, _ := strconv.Atoi(eval(`document.querySelector('#chart svg').dataset.buckets`)); n < 24 || n > 25 {
		t.Errorf("%d buckets for the last 24 hours, want 24 or 25 (hours)", n)
	}
	if got := text("#chart .legend"); !strings.Contains(got, "Human (2)") || !strings.Contains(got, "Bot (1)") || !strings.Contains(got, "Flood (0)") {
		t.Errorf("chart legend %q", got)
	}
	for field, want := range map[string]string{"total": "3", "human": "2", "bot": "1", "flood": "0", "unique-visitors": "2", "bot-share": "33.3 %"} {
		if got := text(fmt.Sprintf(`#stats-totals td[data-field=%q]`, field)); got != want {
			t.Errorf("totals: %s = %q, want %q", field, got, want)
		}
	}
	for table, want := range map[string][]string{
		"#stats-referrers": {"news.example1", "(direct)1"},
		"#stats-browsers":  {"Firefox2"},
		"#stats-devices":   {"desktop2"},
		"#stats-countries": {"Germany (DE)1", "(unknown)1"},
		"#stats-rules":     {"promo1"},
		"#stats-variants":  {"only1"},
	} {
		got := text(table)
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q, want a row %q", table, got, w)
			}
		}
		if strings.Contains(strings.ToLower(got), "bot") {
			t.Errorf("%s: %q: the bot's click is in a breakdown", table, got)
		}
	}
	if got := text("#stats-target"); got != shortURL+" → "+longURL {
		t.Errorf("stats page names the link %q", got)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	saveScreenshot(t, shot)

	// Revoke: a confirm step, then the link is gone from the list and the
	// redirect.
	// The list keeps its rows while it reloads: wait for the reload, or the
	// click may land on a row it is replacing.
	n = eval(listed)
	do("revoke",
		chromedp.Click(chromedp.CSS("#back-to-links")),
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`Number(%s) > %s`, listed, n), chromedp.WithPollingTimeout(20*time.Second)),
		chromedp.Click(chromedp.CSS(row+" button.revoke")),
		chromedp.WaitVisible(chromedp.CSS("#confirm-dialog")))
	if got := text("#confirm-code"); got != code {
		t.Errorf("confirm dialog names %q, want %q", got, code)
	}
	do("confirm the revocation", chromedp.Click(chromedp.CSS("#confirm-ok")), chromedp.WaitNotPresent(chromedp.CSS(row)))
	if st, _ := visit(t, shortURL, humanUA, "", geoiptest.IPv4DE); st != http.StatusNotFound && st != http.StatusGone {
		t.Errorf("GET %s after revoking: %d, want 404 or 410", shortURL, st)
	}

	// A code from the URL: created once; the same URL again answers with
	// the same short URL, marked as existing.
	fromURL := "https://example.com/console-from-url/" + strings.ToLower(rand.Text()[:8])
	var shortURLs []string
	for i, want := range []string{"Created", "Exists already"} {
		n := eval(listed)
		do(fmt.Sprintf("create from the URL (%d)", i+1),
			chromedp.Click(chromedp.CSS("#new-link")),
			chromedp.WaitVisible(chromedp.CSS("#link-dialog")),
			chromedp.SendKeys(chromedp.CSS("#f-long-url"), fromURL),
			chromedp.Click(chromedp.CSS("#f-from-url")),
			chromedp.Click(chromedp.CSS("#link-save")),
			chromedp.WaitNotVisible(chromedp.CSS("#link-dialog")),
			chromedp.Poll[chromedp.Void](fmt.Sprintf(`Number(%s) > %s`, listed, n), chromedp.WithPollingTimeout(20*time.Second)))
		if got := text("#created-what"); got != want {
			t.Errorf("create %d from the URL: notice %q (form error %q), want %q", i+1, got, text("#link-form-error"), want)
		}
		shortURLs = append(shortURLs, text("#created-short-url"))
	}
	if shortURLs[0] == "" || shortURLs[0] != shortURLs[1] || shortURLs[0] == shortURL {
		t.Errorf("short URLs from the URL: %q; want one new link, twice", shortURLs)
	}
	fromURLCode := shortURLs[0][strings.LastIndex(shortURLs[0], "/")+1:]
	if n := eval(fmt.Sprintf(`String(document.querySelectorAll('tr[data-code=%q]').length)`, fromURLCode)); n != "1" {
		t.Errorf("the link from the URL is listed %s times, want once", n)
	}
	t.Logf("browser session took %v", time.Since(start).Round(time.Millisecond))
}

// startGateway runs the gateway in-process in front of the stack.
func startGateway(t *testing.T, s *stack) *servertest.Running {
	t.Helper()
	var cfg app.Config
	env := gatewaytest.GatewayEnv(s.limiter.GRPCAddr, s.shortener.GRPCAddr, s.analytics.GRPCAddr, adminToken)
	env["KURZ_GATEWAY_ALLOW_ANONYMOUS"] = "false"
	env["KURZ_GATEWAY_TRUSTED_PROXIES"] = ""
	err := config.LoadFrom(servertest.Env(env), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := app.New(context.Background(), cfg, servertest.Logger(t))
	if err != nil {
		t.Fatalf("gateway: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "")
	return r
}

// postJSON POSTs body to path of the public API with key and returns the
// answer's status and body.
func postJSON(t *testing.T, gw *servertest.Running, key, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, gw.HTTP+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return resp.StatusCode, b
}

// createLink creates a link to longURL through the public API with key and
// returns its code.
func createLink(t *testing.T, gw *servertest.Running, key, longURL string) string {
	t.Helper()
	status, b := postJSON(t, gw, key, "/v1/links", fmt.Sprintf(`{"longUrl":%q}`, longURL))
	var link struct{ Code string }
	if status != http.StatusCreated || json.Unmarshal(b, &link) != nil || link.Code == "" {
		t.Fatalf("create link: %d %s", status, b)
	}
	return link.Code
}

// getLink reads the link code through the public API with key into v.
func getLink(t *testing.T, gw *servertest.Running, key, code string, v any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, gw.HTTP+"/v1/links/"+code, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || json.Unmarshal(b, v) != nil {
		t.Fatalf("get link %s: %d %s (%v)", code, resp.StatusCode, b, err)
	}
}

// newTenant creates a tenant with one API key through the admin API and
// returns its id and the key; the tenant, its plan row, its links and its
// domains are deleted when the test ends.
func newTenant(t *testing.T, s *stack, gw *servertest.Running) (id, key string) {
	t.Helper()
	id = "console-" + strings.ToLower(rand.Text()[:10])
	gatewaytest.CleanupTenants(t, s.db, id)
	admin := func(path, body string) map[string]any {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, gw.HTTP+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+adminToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &m) != nil {
			t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b)
		}
		return m
	}
	admin("/v1/admin/tenants", fmt.Sprintf(`{"id":%q,"name":"Console test","plan":"pro"}`, id))
	key, _ = admin("/v1/admin/tenants/"+id+"/keys", `{"name":"console"}`)["key"].(string)
	if key == "" {
		t.Fatal("the admin API issued no key")
	}
	return id, key
}

// visit GETs a short URL as a browser at ip would, through the redirect's
// trusted proxy (without following the redirect), and returns the status
// and Location.
func visit(t *testing.T, url, ua, referer, ip string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("User-Agent", ua)
	req.Header.Set("Accept", "text/html,application/xhtml+xml")
	req.Header.Set("X-Forwarded-For", ip)
	if referer != "" {
		req.Header.Set("Referer", referer)
	}
	client := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Location")
}

// saveScreenshot writes the stats page's PNG to $KURZ_ARTIFACTS_DIR (by
// default <repo>/artifacts), and to docs/ for the README when
// KURZ_UPDATE_SCREENSHOT=1.
func saveScreenshot(t *testing.T, png []byte) {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("KURZ_ARTIFACTS_DIR")
	if dir == "" {
		dir = filepath.Join(root, "artifacts")
	}
	paths := []string{filepath.Join(dir, "console-stats.png")}
	if os.Getenv("KURZ_UPDATE_SCREENSHOT") == "1" {
		paths = append(paths, filepath.Join(root, "docs", "console-stats.png"))
	}
	for _, p := range paths {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot of the stats page: %s", p)
	}
}

// repoRoot is the directory of go.mod above the test's directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the test's directory")
		}
		dir = parent
	}
}
