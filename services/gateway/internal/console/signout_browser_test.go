//go:build integration

package console_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"kurz.dev/pkg/geoip/geoiptest"
	"kurz.dev/pkg/testkit/servertest"
)

// Signing out forgets everything the key showed. Tenant A looks at its
// link's stats, goes back to its list and to the stats again, then signs
// out; tenant B signs in in the same tab and sees nothing of A's (not the
// stats page A left, not A's links, not the filter), nor does Back, pressed
// as far as the console goes, lead B to anything A looked at. Then, as B: a stats load that
// fails (another tenant's code) shows no numbers of the link drawn before
// it; two submits of a slow Create make one link; and a 2,048-character
// destination and a stranger's 250-character referrer host wrap instead of
// widening the page.
func TestConsoleForgetsWhatTheLastKeyShowed(t *testing.T) {
	s := startStack(t)
	gw := startGateway(t, s)
	_, keyA := newTenant(t, s, gw)
	_, keyB := newTenant(t, s, gw)
	secretURL := "https://example.com/tenant-a-secret-plan"
	codeA := createLink(t, gw, keyA, secretURL)
	longURL := "https://example.com/" + strings.Repeat("w", 2048-len("https://example.com/"))
	codeB := createLink(t, gw, keyB, longURL)

	b := startBrowser(t)
	do, eval, text := b.do, b.eval, b.text
	signIn := func(key string) {
		t.Helper()
		do("sign in",
			chromedp.WaitVisible(chromedp.CSS("#signin-key")),
			chromedp.SendKeys(chromedp.CSS("#signin-key"), key),
			chromedp.Click(chromedp.CSS("#signin-submit")),
			chromedp.WaitNotVisible(chromedp.CSS("#view-signin")))
	}
	statsRenders := `Number(document.getElementById('view-stats').dataset.renders || 0)`
	openStats := func(code string) {
		t.Helper()
		n := eval(`String(` + statsRenders + `)`)
		do("open the stats of "+code,
			chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`location.hash = '#/stats/%s'`, code)),
			chromedp.Poll[chromedp.Void](fmt.Sprintf(`%s > %s`, statsRenders, n), chromedp.WithPollingTimeout(20*time.Second)))
	}

	// A: its link's stats, the list, the stats again, then sign out from
	// the stats page.
	do("open the console", chromedp.Navigate(gw.HTTP+"/console"))
	signIn(keyA)
	openStats(codeA)
	if got := text("#stats-target"); !strings.Contains(got, secretURL) {
		t.Fatalf("A's stats page names %q, want its link to %s", got, secretURL)
	}
	do("back to the list", chromedp.Click(chromedp.CSS("#back-to-links")), chromedp.WaitVisible(chromedp.CSS("#view-links")))
	openStats(codeA)
	do("sign out", chromedp.Click(chromedp.CSS("#signout")), chromedp.WaitVisible(chromedp.CSS("#signin-key")))
	if h := eval(`location.hash`); strings.HasPrefix(h, "#/stats/") {
		t.Errorf("after signing out the address is still %q", h)
	}

	// B, same tab: nothing of A's anywhere in the page.
	signIn(keyB)
	do("B's list", chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#links-body tr[data-code=%q]`, codeB))))
	page := eval(`document.body.innerText + document.body.innerHTML`)
	for _, leak := range []string{secretURL, codeA} {
		if strings.Contains(page, leak) {
			t.Errorf("B's console holds A's %q", leak)
		}
	}

	// B presses Back as far as the console goes: each step shows B's
	// links, never a page of A's, nor its address.
	for step := 1; ; step++ {
		nav, err := chromedp.Run(b.ctx, chromedp.NavigationEntries())
		if err != nil {
			t.Fatalf("navigation history: %v", err)
		}
		if cur := nav.CurrentIndex; cur == 0 || !strings.HasPrefix(nav.Entries[cur-1].URL, gw.HTTP+"/console") {
			if step < 5 {
				t.Fatalf("Back went %d steps, want at least A's 4 before B's (the test went wrong)", step-1)
			}
			break
		}
		// Back settles once the entry's document (a new one, or this one
		// after its popstate) has routed: the view shown is the address's.
		eval(`(() => { window.beforeBack = true; addEventListener('popstate', () => { window.popped = true; }, { once: true });
			history.back(); return ''; })()`)
		do(fmt.Sprintf("Back, %d", step), chromedp.Poll[chromedp.Void](`(!window.beforeBack || window.popped) && document.readyState === 'complete' && (() => {
			const shown = ['signin', 'links', 'domains', 'stats', 'webhooks'].filter((v) => !document.getElementById('view-' + v).hidden);
			const h = location.hash;
			const want = h.startsWith('#/stats/') ? 'stats' : h === '#/domains' ? 'domains' : h === '#/webhooks' ? 'webhooks' : 'links';
			return shown.length === 1 && shown[0] === want;
		})()`, chromedp.WithPollingTimeout(20*time.Second)))
		page := eval(`location.href + document.body.innerText + document.body.innerHTML`)
		for _, leak := range []string{secretURL, codeA} {
			if strings.Contains(page, leak) {
				t.Errorf("Back, %d steps after B signed in: the page holds A's %q (at %s)", step, leak, eval(`location.href`))
			}
		}
	}

	// B's own stats, then A's code (refused): no numbers of B's link under
	// the heading naming A's code.
	openStats(codeB)
	if got := text("#stats-target"); !strings.Contains(got, longURL) {
		t.Fatalf("B's stats page names %q, want its link", got)
	}
	if w := eval(`String(document.documentElement.scrollWidth <= window.innerWidth)`); w != "true" {
		t.Errorf("a 2,048-character destination widens the page to %s px", eval(`String(document.documentElement.scrollWidth)`))
	}
	openStats(codeA)
	if text("#stats-error") == "" {
		t.Fatal("B opened A's code and no error is shown")
	}
	if got := text("#stats-target") + text("#stats-totals"); got != "" {
		t.Errorf("the stats page of a code that failed to load shows %q, left from the link before", got)
	}

	// Two submits of a Create whose request takes half a second: one link.
	dupURL := "https://example.com/once/" + strings.ToLower(codeB)
	eval(`(() => {
		const fetch = window.fetch;
		window.fetch = (url, init) => init && init.method === 'POST'
			? new Promise((resolve) => setTimeout(() => resolve(fetch(url, init)), 500))
			: fetch(url, init);
		return '';
	})()`)
	do("create twice",
		chromedp.Evaluate[chromedp.Void](`location.hash = '#/links'`),
		chromedp.WaitVisible(chromedp.CSS("#new-link")),
		chromedp.Click(chromedp.CSS("#new-link")),
		chromedp.WaitVisible(chromedp.CSS("#link-dialog")),
		chromedp.SendKeys(chromedp.CSS("#f-long-url"), dupURL),
		chromedp.Evaluate[chromedp.Void](`(() => { const f = document.getElementById('link-form'); f.requestSubmit(); f.requestSubmit(); })()`),
		chromedp.WaitNotVisible(chromedp.CSS("#link-dialog")))
	if n := countLinks(t, gw, keyB, dupURL); n != 1 {
		t.Errorf("two submits of one Create made %d links, want 1", n)
	}

	// A stranger's long referrer host in B's stats: the page keeps its width.
	host := strings.Repeat("a", 60) + "." + strings.Repeat("b", 60) + "." + strings.Repeat("c", 60) + "." + strings.Repeat("d", 60) + ".com"
	if st, _ := visit(t, s.redirectURL+"/"+codeB, humanUA, "https://"+host+"/", geoiptest.IPv4DE); st != http.StatusFound {
		t.Fatalf("visit %s: %d, want 302", codeB, st)
	}
	openStats(codeB)
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(text("#stats-referrers"), host) {
		if time.Now().After(deadline) {
			t.Fatalf("the referrer never reached the stats: %q (error %q)", text("#stats-referrers"), text("#stats-error"))
		}
		n := eval(`String(` + statsRenders + `)`)
		do("refresh the stats", chromedp.Click(chromedp.CSS("#stats-refresh")),
			chromedp.Poll[chromedp.Void](fmt.Sprintf(`%s > %s`, statsRenders, n), chromedp.WithPollingTimeout(20*time.Second)))
		time.Sleep(300 * time.Millisecond) // the poll interval of a person pressing Refresh
	}
	if w := eval(`String(document.documentElement.scrollWidth <= window.innerWidth)`); w != "true" {
		t.Errorf("a %d-character referrer host widens the page to %s px", len(host), eval(`String(document.documentElement.scrollWidth)`))
	}
}

// countLinks counts key's links to longURL, through the public API (the
// first 100 links: the tests' tenants have a few).
func countLinks(t *testing.T, gw *servertest.Running, key, longURL string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, gw.HTTP+"/v1/links?page_size=100", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("list links: %v", err)
	}
	defer resp.Body.Close()
	var page struct {
		Links []struct {
			LongURL string `json:"longUrl"`
		}
	}
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK || json.Unmarshal(b, &page) != nil {
		t.Fatalf("list links: %d %s", resp.StatusCode, b)
	}
	n := 0
	for _, l := range page.Links {
		if l.LongURL == longURL {
			n++
		}
	}
	return n
}
