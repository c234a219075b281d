//go:build integration

package console_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// A save acts only on the opening of the dialog it was sent from. While a
// slow Create is in flight the form says it is saving, and neither Cancel
// nor Escape closes it. Closed anyway (Chrome closes a dialog on a second
// Escape whatever the page says), the next New link form is not blocked by
// it; and when the first answer lands, it neither closes the form open by
// then nor discards what was typed in it, nor replaces the notice of the
// link made in between.
func TestConsoleSaveAnswersOnlyItsOwnDialog(t *testing.T) {
	s := startStack(t)
	gw := startGateway(t, s)
	_, key := newTenant(t, s, gw)
	stamp := strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")) + "-" + fmt.Sprint(time.Now().UnixNano())
	first, second, third := "https://example.com/first/"+stamp, "https://example.com/second/"+stamp, "https://example.com/third/"+stamp

	b := startBrowser(t)
	do, eval, text := b.do, b.eval, b.text
	do("sign in",
		signIn(gw.HTTP+"/console", key),
		chromedp.WaitVisible(chromedp.CSS("#view-links")))
	// The first Create waits for releaseFirst(); later ones go at once.
	eval(`(() => {
		const fetch = window.fetch;
		let held = false;
		window.fetch = (url, init) => {
			if (!held && init && init.method === 'POST' && String(url) === '/v1/links') {
				held = true;
				return new Promise((resolve) => { window.releaseFirst = () => resolve(fetch(url, init)); });
			}
			return fetch(url, init);
		};
		return '';
	})()`)
	open := `String(document.getElementById('link-dialog').open)`

	do("create a link, slowly",
		chromedp.Click(chromedp.CSS("#new-link")),
		chromedp.WaitVisible(chromedp.CSS("#link-dialog")),
		chromedp.SendKeys(chromedp.CSS("#f-long-url"), first),
		chromedp.Click(chromedp.CSS("#link-save")),
		chromedp.Poll[chromedp.Void](`typeof window.releaseFirst === 'function'`, chromedp.WithPollingTimeout(10*time.Second)))
	if got := eval(`(() => { const s = document.querySelector('#link-dialog .saving');
		return s && !s.hidden ? s.textContent : ''; })()`); got != "Saving…" {
		t.Errorf("while the Create is in flight the dialog says %q, want Saving…", got)
	}
	if got := eval(`String(document.getElementById('link-save').disabled && document.getElementById('link-cancel').disabled)`); got != "true" {
		t.Errorf("while the Create is in flight Create and Cancel are not both disabled")
	}
	do("press Cancel", chromedp.Click(chromedp.CSS("#link-cancel")))
	if eval(open) != "true" {
		t.Errorf("Cancel closed the dialog while its Create was in flight")
	}
	do("press Escape", chromedp.KeyEvent(kb.Escape))
	if eval(open) != "true" {
		t.Errorf("Escape closed the dialog while its Create was in flight")
	}

	// Closed anyway; another link is made through a new form.
	eval(`document.getElementById('link-dialog').close(), ''`)
	do("open the form again",
		chromedp.Click(chromedp.CSS("#new-link")),
		chromedp.WaitVisible(chromedp.CSS("#link-dialog")))
	if got := eval(`String(document.getElementById('link-save').disabled) + ' ' + document.getElementById('f-long-url').value`); got != "false " {
		t.Fatalf("the new form: Create disabled, URL = %q, want enabled and empty", got)
	}
	do("create another link",
		chromedp.SendKeys(chromedp.CSS("#f-long-url"), second),
		chromedp.Click(chromedp.CSS("#link-save")),
		chromedp.WaitNotVisible(chromedp.CSS("#link-dialog")))
	notice := text("#created-short-url")
	if notice == "" {
		t.Fatalf("no notice after the second Create (form error %q)", text("#link-form-error"))
	}

	// A third form, typed in; then the first answer lands.
	listed := func(url string) string {
		return fmt.Sprintf(`[...document.querySelectorAll('#links-body .target')].some((e) => e.textContent === %q)`, url)
	}
	do("type in a third form, then the first Create is answered",
		chromedp.Poll[chromedp.Void](listed(second), chromedp.WithPollingTimeout(20*time.Second)),
		chromedp.Click(chromedp.CSS("#new-link")),
		chromedp.WaitVisible(chromedp.CSS("#link-dialog")),
		chromedp.SendKeys(chromedp.CSS("#f-long-url"), third),
		chromedp.Evaluate[chromedp.Void](`window.releaseFirst()`),
		chromedp.Poll[chromedp.Void](listed(first), chromedp.WithPollingTimeout(20*time.Second)))
	if eval(open) != "true" {
		t.Errorf("the first Create's late answer closed the form opened after it")
	}
	if got := eval(`document.getElementById('f-long-url').value`); got != third {
		t.Errorf("the third form holds %q after the first Create's answer, want what was typed: %q", got, third)
	}
	if got := text("#created-short-url"); got != notice {
		t.Errorf("the notice names %q after the first Create's late answer, want the second link's %q", got, notice)
	}
	if got := text("#link-form-error"); got != "" {
		t.Errorf("the third form shows the error %q", got)
	}
	for _, url := range []string{first, second, third} {
		want := map[string]int{first: 1, second: 1, third: 0}[url]
		if n := countLinks(t, gw, key, url); n != want {
			t.Errorf("%d links to %s, want %d", n, url, want)
		}
	}
}
