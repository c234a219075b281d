//go:build integration

package console_test

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"kurz.dev/pkg/testkit/servertest"
)

// Custom domains in the console, in headless Chromium: the domains view
// adds a domain and shows the TXT record to publish; Verify (no DNS in
// tests) shows the API's message; once an administrator approved it, it
// is listed verified, the new-link form offers it in its domain selector,
// and a link created on it gets its short URL on the domain; the redirect
// serves it by Host, and its stats page names the domain and counts the
// click.
func TestConsoleDomains(t *testing.T) {
	s := startStack(t)
	gw := startGateway(t, s)
	tenant, key := newTenant(t, s, gw)
	domain := "go-" + strings.ToLower(rand.Text()[:10]) + ".console.test"
	b := startBrowser(t)
	do, eval, text := b.do, b.eval, b.text
	renders := `Number(document.getElementById('view-domains').dataset.renders)`

	do("sign in",
		signIn(gw.HTTP+"/console", key),
		chromedp.WaitVisible(chromedp.CSS("#view-links")))
	do("open the domains view", chromedp.Click(chromedp.CSS("#nav-domains")), chromedp.WaitVisible(chromedp.CSS("#view-domains")),
		chromedp.Poll[chromedp.Void](renders+` > 0`, chromedp.WithPollingTimeout(20*time.Second)))
	if got := eval(`String(!document.getElementById('domains-empty').hidden)`); got != "true" {
		t.Errorf("a new tenant's domains view does not say it has none")
	}

	row := fmt.Sprintf(`tr[data-domain=%q]`, domain)
	do("add a domain",
		chromedp.SendKeys(chromedp.CSS("#domain-name"), strings.ToUpper(domain)),
		chromedp.Click(chromedp.CSS("#domain-add")),
		chromedp.WaitVisible(chromedp.CSS(row)))
	if got := text(row + " .status"); got != "not verified" {
		t.Errorf("new domain's status %q", got)
	}
	if got := text(row + " td:nth-child(3) code"); got != "_kurz-challenge."+domain {
		t.Errorf("TXT record shown %q", got)
	}
	if got := text(row + " .token"); !strings.HasPrefix(got, "kurz-verify=") {
		t.Errorf("TXT value shown %q", got)
	}
	n := eval(`String(` + renders + `)`)
	do("verify without DNS", chromedp.Click(chromedp.CSS(row+" button.verify")),
		chromedp.Poll[chromedp.Void](renders+` > `+n, chromedp.WithPollingTimeout(20*time.Second)))
	if got := text("#domains-error"); !strings.Contains(got, "_kurz-challenge."+domain) {
		t.Errorf("verify without DNS: error %q, want the API's message naming the record", got)
	}

	// The administrator approves it; the view shows it verified.
	approve(t, gw.HTTP, tenant, domain)
	do("reload the domains", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(row)),
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`(document.querySelector(%q) || {}).textContent === 'verified'`, row+" .status"),
			chromedp.WithPollingTimeout(20*time.Second)))

	// A link on the domain through the form's selector.
	alias := "c" + strings.ToLower(rand.Text()[:8])
	do("open the new-link form on the domain",
		chromedp.Click(chromedp.CSS("#nav-links")), chromedp.WaitVisible(chromedp.CSS("#view-links")),
		chromedp.Click(chromedp.CSS("#new-link")), chromedp.WaitVisible(chromedp.CSS("#link-dialog")),
		chromedp.Poll[chromedp.Void](`document.getElementById('f-domain').dataset.loaded === '1'`, chromedp.WithPollingTimeout(20*time.Second)))
	if got := eval(`Array.from(document.getElementById('f-domain').options).map(o => o.value).join(',')`); got != ","+domain {
		t.Fatalf("domain selector offers %q, want the default and %s", got, domain)
	}
	do("create the link on the domain",
		chromedp.SetValue(chromedp.CSS("#f-domain"), domain),
		chromedp.SendKeys(chromedp.CSS("#f-long-url"), "https://example.com/console-domain"),
		chromedp.SendKeys(chromedp.CSS("#f-alias"), alias),
		chromedp.Click(chromedp.CSS("#link-save")),
		chromedp.WaitVisible(chromedp.CSS("#created-short-url")))
	if got := text("#created-short-url"); got != "https://"+domain+"/"+alias {
		t.Fatalf("short URL on the page %q (form error %q), want it on the domain", got, text("#link-form-error"))
	}
	linkRow := fmt.Sprintf(`tr[data-code=%q][data-domain=%q]`, alias, domain)
	do("the link in the list", chromedp.WaitVisible(chromedp.CSS(linkRow+" a.short")))

	// A visitor follows it: the redirect answers for the domain (once it has
	// read the verified set) by the Host header, and the click is counted.
	if !servertest.Eventually(20*time.Second, func() bool {
		status, _ := visitHost(t, s.redirectURL+"/"+alias, domain)
		return status == http.StatusFound
	}) {
		t.Fatalf("the redirect did not serve %s/%s within 20 s", domain, alias)
	}
	do("its stats page", chromedp.Click(chromedp.CSS(linkRow+" a.stats")), chromedp.WaitVisible(chromedp.CSS("#view-stats")),
		chromedp.Poll[chromedp.Void](`Number(document.getElementById('view-stats').dataset.renders) > 0`, chromedp.WithPollingTimeout(20*time.Second)))
	if got := text("#stats-code"); got != domain+"/"+alias {
		t.Errorf("stats page names %q, want %s/%s", got, domain, alias)
	}
	if got := text("#stats-error"); got != "" {
		t.Errorf("stats page error %q", got)
	}
	if got := text("#stats-target"); !strings.HasPrefix(got, "https://"+domain+"/"+alias) {
		t.Errorf("stats target %q", got)
	}
	// The click reaches the domain's link's statistics (not the default
	// domain's code), refreshed until the consumer has stored it.
	statsRenders := `document.getElementById('view-stats').dataset.renders`
	total := `(document.querySelector('#stats-totals [data-field=total]') || {}).textContent || ''`
	deadline := time.Now().Add(90 * time.Second)
	for eval(total) != "1" {
		if time.Now().After(deadline) {
			t.Fatalf("the stats of %s/%s show total %q (error %q), want 1", domain, alias, eval(total), text("#stats-error"))
		}
		time.Sleep(300 * time.Millisecond) // the poll interval of a person pressing Refresh
		n := eval(statsRenders)
		do("refresh the stats", chromedp.Click(chromedp.CSS("#stats-refresh")),
			chromedp.Poll[chromedp.Void](fmt.Sprintf(`Number(%s) > %s`, statsRenders, n), chromedp.WithPollingTimeout(20*time.Second)))
	}
}

// visitHost GETs url with the Host header host, without following the
// redirect, and returns the status and Location.
func visitHost(t *testing.T, url, host string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	req.Header.Set("User-Agent", humanUA)
	client := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s (Host %s): %v", url, host, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Location")
}

// approve verifies tenant's domain through the admin API.
func approve(t *testing.T, base, tenant, domain string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/admin/tenants/"+tenant+"/domains/"+domain+"/verify", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("approve %s: %d %s", domain, resp.StatusCode, b)
	}
}

// Deleting a custom domain asks first, and the question names what is
// lost: adding the domain again means a new TXT value and verifying it
// again. Cancel keeps the domain; Delete deletes it.
func TestConsoleAsksBeforeDeletingADomain(t *testing.T) {
	s := startStack(t)
	gw := startGateway(t, s)
	tenant, key := newTenant(t, s, gw)
	domain := "go-" + strings.ToLower(rand.Text()[:10]) + ".console.test"
	addDomain(t, gw, key, domain)
	approve(t, gw.HTTP, tenant, domain)
	row := fmt.Sprintf(`#domains-body tr[data-domain=%q]`, domain)

	b := startBrowser(t)
	do, eval, text := b.do, b.eval, b.text
	do("sign in and open the domains",
		signIn(gw.HTTP+"/console", key),
		chromedp.WaitVisible(chromedp.CSS("#view-links")),
		chromedp.Click(chromedp.CSS("#nav-domains")),
		chromedp.WaitVisible(chromedp.CSS(row+" button.delete")))
	asking := `String(!!(document.getElementById('domain-confirm-dialog') || {}).open)`
	do("press Delete", chromedp.Click(chromedp.CSS(row+" button.delete")))
	if eval(asking) != "true" {
		t.Fatalf("Delete asked nothing (the domain is listed by the API: %t)", hasDomain(t, gw, key, domain))
	}
	if got := text("#domain-confirm-dialog"); !strings.Contains(got, domain) || !strings.Contains(got, "verification again") {
		t.Errorf("the confirmation says %q: want the domain, and that adding it again means verifying it again", got)
	}
	do("cancel", chromedp.Click(chromedp.CSS("#domain-confirm-cancel")), chromedp.WaitNotVisible(chromedp.CSS("#domain-confirm-dialog")))
	if !hasDomain(t, gw, key, domain) {
		t.Fatalf("Cancel deleted the domain")
	}
	do("delete after all",
		chromedp.Click(chromedp.CSS(row+" button.delete")),
		chromedp.WaitVisible(chromedp.CSS("#domain-confirm-dialog")),
		chromedp.Click(chromedp.CSS("#domain-confirm-ok")),
		chromedp.WaitNotPresent(chromedp.CSS(row)))
	if hasDomain(t, gw, key, domain) {
		t.Errorf("the domain is still there after Delete was confirmed (error %q)", text("#domain-confirm-error"))
	}
}

// addDomain adds domain to key's tenant through the public API.
func addDomain(t *testing.T, gw *servertest.Running, key, domain string) {
	t.Helper()
	if status, b := postJSON(t, gw, key, "/v1/domains", fmt.Sprintf(`{"name":%q}`, domain)); status != http.StatusCreated {
		t.Fatalf("add domain %s: %d %s", domain, status, b)
	}
}

// hasDomain reports whether key's tenant has domain, through the public API.
func hasDomain(t *testing.T, gw *servertest.Running, key, domain string) bool {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, gw.HTTP+"/v1/domains", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("list domains: %v", err)
	}
	defer resp.Body.Close()
	var out struct{ Domains []struct{ Name string } }
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK || json.Unmarshal(b, &out) != nil {
		t.Fatalf("list domains: %d %s", resp.StatusCode, b)
	}
	for _, d := range out.Domains {
		if d.Name == domain {
			return true
		}
	}
	return false
}
