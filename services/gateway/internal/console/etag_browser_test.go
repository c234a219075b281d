//go:build integration

package console_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The edit form saves only over the link it showed: when someone else
// changed the link after the form opened, Save changes nothing and says
// so, and the other change stays.
func TestConsoleEditKeepsAChangeMadeElsewhere(t *testing.T) {
	s := startStack(t)
	gw := startGateway(t, s)
	_, key := newTenant(t, s, gw)
	longURL := "https://example.com/console/etag-" + strings.ToLower(time.Now().Format("150405.000000"))
	code := createLink(t, gw, key, longURL)

	b := startBrowser(t)
	do, text := b.do, b.text
	row := `tr[data-code="` + code + `"]`
	do("sign in and open the link's form",
		signIn(gw.HTTP+"/console", key),
		chromedp.WaitVisible(chromedp.CSS(row+" button.edit")),
		chromedp.Click(chromedp.CSS(row+" button.edit")),
		chromedp.WaitVisible(chromedp.CSS("#link-dialog")))

	// Someone else tags the link while the form is open.
	req, err := http.NewRequest(http.MethodPatch, gw.HTTP+"/v1/links/"+code, strings.NewReader(`{"tags": ["elsewhere"]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the change made elsewhere: %v, %v", resp, err)
	}
	resp.Body.Close()

	do("change the URL in the form and save",
		chromedp.Evaluate[chromedp.Void](`document.getElementById('f-long-url').value = ''`),
		chromedp.SendKeys(chromedp.CSS("#f-long-url"), longURL+"/from-the-form"),
		chromedp.Click(chromedp.CSS("#link-save")),
		chromedp.Poll[chromedp.Void](`document.getElementById('link-form-error').textContent !== ''`, chromedp.WithPollingTimeout(20*time.Second)))
	if got := text("#link-form-error"); !strings.Contains(got, "changed elsewhere") {
		t.Errorf("the form says %q, want that the link was changed elsewhere", got)
	}

	var link struct {
		LongURL string   `json:"longUrl"`
		Tags    []string `json:"tags"`
	}
	if getLink(t, gw, key, code, &link); link.LongURL != longURL || len(link.Tags) != 1 || link.Tags[0] != "elsewhere" {
		t.Errorf("the link after the refused save: %+v; want its URL as it was and the tag set elsewhere", link)
	}
}
