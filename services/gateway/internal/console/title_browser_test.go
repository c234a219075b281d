//go:build integration

package console_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// A link's title is set in the form, shown in the list and on the stats
// page as text, changed and removed through the same form. A title that
// is markup stays text: no element it names is made, nothing of it runs
// (and the CSP reports nothing, which browser checks).
func TestConsoleLinkTitles(t *testing.T) {
	s := startStack(t)
	gw := startGateway(t, s)
	_, key := newTenant(t, s, gw)
	b := startBrowser(t)
	do, eval, text := b.do, b.eval, b.text
	jsString := func(s string) string { j, _ := json.Marshal(s); return string(j) }
	listed := `document.getElementById('view-links').dataset.renders`
	const markup = `<img src=x onerror="window.pwned=1"><script>window.pwned=2</script> Spring sale ✓`

	longURL := "https://example.com/console/title-" + strings.ToLower(time.Now().Format("150405.000000"))
	do("create a link with a title",
		signIn(gw.HTTP+"/console", key),
		chromedp.WaitVisible(chromedp.CSS("#view-links")),
		chromedp.Click(chromedp.CSS("#new-link")),
		chromedp.WaitVisible(chromedp.CSS("#link-dialog")),
		chromedp.SendKeys(chromedp.CSS("#f-long-url"), longURL),
		chromedp.Evaluate[chromedp.Void](`document.getElementById('f-title').value = `+jsString(markup)),
		chromedp.Click(chromedp.CSS("#link-save")),
		chromedp.WaitVisible(chromedp.CSS("#created-short-url")))
	shortURL := text("#created-short-url")
	code := shortURL[strings.LastIndex(shortURL, "/")+1:]
	row := fmt.Sprintf(`tr[data-code=%q]`, code)
	do("the link in the list", chromedp.WaitVisible(chromedp.CSS(row+" .link-title")))
	if got := text(row + " .link-title"); got != markup {
		t.Errorf("listed title %q (form error %q), want the title as text, %q", got, text("#link-form-error"), markup)
	}
	if got := text(row + " .target"); got != longURL {
		t.Errorf("listed target %q, want %q beside the title", got, longURL)
	}
	if got := eval(`String(document.querySelectorAll('#links-table img, #links-table script').length) + '/' + String(window.pwned)`); got != "0/undefined" {
		t.Errorf("elements made of the title / what its script set: %s, want 0/undefined", got)
	}

	// The form shows the title; a new one is saved and listed.
	const renamed = "Renamed — “quoted” & <b>not bold</b>"
	n := eval(listed)
	do("change the title",
		chromedp.Click(chromedp.CSS(row+" button.edit")),
		chromedp.WaitVisible(chromedp.CSS("#link-dialog")))
	if got := eval(`document.getElementById('f-title').value`); got != markup {
		t.Errorf("title in the form: %q, want %q", got, markup)
	}
	do("save the new title",
		chromedp.Evaluate[chromedp.Void](`document.getElementById('f-title').value = `+jsString(renamed)),
		chromedp.Click(chromedp.CSS("#link-save")),
		chromedp.WaitNotVisible(chromedp.CSS("#link-dialog")),
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`Number(%s) > %s`, listed, n), chromedp.WithPollingTimeout(20*time.Second)))
	if got := text(row + " .link-title"); got != renamed {
		t.Errorf("listed title after the edit %q (form error %q), want %q", got, text("#link-form-error"), renamed)
	}
	if got := eval(`String(document.querySelectorAll('#links-table b').length)`); got != "0" {
		t.Errorf("%s <b> elements made of the title, want none", got)
	}

	// The stats page names the link by its title too.
	renders := `document.getElementById('view-stats').dataset.renders`
	n = eval(renders)
	do("open the stats page", chromedp.Click(chromedp.CSS(row+" a.stats")), chromedp.WaitVisible(chromedp.CSS("#view-stats")),
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`Number(%s) > %s`, renders, n), chromedp.WithPollingTimeout(25*time.Second)))
	if got := text("#stats-title"); got != renamed {
		t.Errorf("stats page title %q (stats error %q), want %q", got, text("#stats-error"), renamed)
	}

	// Emptied in the form, the title is removed.
	n = eval(listed)
	do("back to the links", chromedp.Click(chromedp.CSS("#back-to-links")),
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`Number(%s) > %s`, listed, n), chromedp.WithPollingTimeout(20*time.Second)),
		chromedp.WaitVisible(chromedp.CSS(row+" button.edit")))
	do("remove the title",
		chromedp.Click(chromedp.CSS(row+" button.edit")),
		chromedp.WaitVisible(chromedp.CSS("#link-dialog")),
		chromedp.Evaluate[chromedp.Void](`document.getElementById('f-title').value = ''`),
		chromedp.Click(chromedp.CSS("#link-save")),
		chromedp.WaitNotVisible(chromedp.CSS("#link-dialog")),
		chromedp.Poll[chromedp.Void](`document.querySelector(`+jsString(row+" .target")+`) !== null &&
			document.querySelector(`+jsString(row+" .link-title")+`) === null`, chromedp.WithPollingTimeout(20*time.Second)))
	var link struct {
		LongURL string `json:"longUrl"`
		Title   string `json:"title"`
	}
	if getLink(t, gw, key, code, &link); link.LongURL != longURL || link.Title != "" {
		t.Errorf("the link after removing its title: %+v; want no title, its URL kept", link)
	}
}
