//go:build integration

package console_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// An answer that arrives after a newer load of the same view started does
// not draw over it. The links list filtered by a tag no link has is
// answered a second late, after the unfiltered list asked for next: the
// page keeps showing the unfiltered list, the tenant's link in it.
func TestConsoleDrawsOnlyTheLatestLoad(t *testing.T) {
	s := startStack(t)
	gw := startGateway(t, s)
	_, key := newTenant(t, s, gw)
	code := createLink(t, gw, key, "https://example.com/latest")
	row := fmt.Sprintf(`#links-body tr[data-code=%q]`, code)

	b := startBrowser(t)
	do, eval := b.do, b.eval
	renders := `Number(document.getElementById('view-links').dataset.renders)`
	do("sign in",
		chromedp.Navigate(gw.HTTP+"/console"),
		chromedp.WaitVisible(chromedp.CSS("#signin-key")),
		chromedp.SendKeys(chromedp.CSS("#signin-key"), key),
		chromedp.Click(chromedp.CSS("#signin-submit")),
		chromedp.WaitVisible(chromedp.CSS(row)))
	before := eval(`String(` + renders + `)`)

	// The next links request leaves a second late; the one after it at once.
	eval(`(() => {
		const fetch = window.fetch;
		let held = false;
		window.fetch = (url, init) => {
			if (!held && String(url).includes('/v1/links?')) {
				held = true;
				return new Promise((resolve) => setTimeout(() => resolve(fetch(url, init)), 1000));
			}
			return fetch(url, init);
		};
		const tag = document.getElementById('filter-tag'), form = document.getElementById('filter-form');
		tag.value = 'no-link-has-this-tag';
		form.requestSubmit();
		tag.value = '';
		form.requestSubmit();
		return '';
	})()`)
	do("both loads land", chromedp.Poll[chromedp.Void](fmt.Sprintf(`%s >= %s + 2`, renders, before), chromedp.WithPollingTimeout(20*time.Second)))
	if got := eval(`String(document.querySelectorAll('` + row + `').length)`); got != "1" {
		t.Errorf("after the late filtered answer: the link's row is drawn %s times, want 1 (the late answer drew over the newer list)", got)
	}
	if got := eval(`String(document.getElementById('links-empty').hidden)`); got != "true" {
		t.Errorf("links-empty hidden=%s, want true", got)
	}
}
