//go:build integration

package console_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/pkg/webhooksig"
)

// The console's webhooks section in headless Chromium: a webhook created
// through the form shows its secret once and is listed; a link event
// reaches the loopback receiver signed with that secret; the deliveries
// list shows one delivered and one dead (the receiver refused it); the
// dead one is redelivered from the page once the receiver recovers; the
// webhook is deleted after a confirmation. No exception, no CSP report.
func TestConsoleWebhooksInBrowser(t *testing.T) {
	s := startStack(t)
	gw := startGateway(t, s)
	_, key := newTenant(t, s, gw)
	b := startBrowser(t)
	do, eval := b.do, b.eval

	var mu sync.Mutex
	refuse := true
	var bodies [][]byte
	var sigs []string
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		bodies, sigs = append(bodies, b), append(sigs, r.Header.Get(webhooksig.Header))
		if refuse && strings.Contains(string(b), "/refused") {
			http.Error(w, "not today", http.StatusServiceUnavailable)
		}
	}))
	defer rcv.Close()

	do("sign in and open the webhooks",
		chromedp.Navigate(gw.HTTP+"/console"),
		chromedp.WaitVisible(chromedp.CSS("#signin-key")),
		chromedp.SendKeys(chromedp.CSS("#signin-key"), key),
		chromedp.Click(chromedp.CSS("#signin-submit")),
		chromedp.WaitVisible(chromedp.CSS("#view-links")),
		chromedp.Click(chromedp.CSS("#nav-webhooks")),
		chromedp.WaitVisible(chromedp.CSS("#view-webhooks")))
	do("create a webhook",
		chromedp.SendKeys(chromedp.CSS("#w-url"), rcv.URL+"/hook"),
		chromedp.Click(chromedp.CSS(`#w-events input[value="link.created"]`)),
		chromedp.SendKeys(chromedp.CSS("#w-description"), "browser test"),
		chromedp.Click(chromedp.CSS("#w-create")),
		chromedp.WaitVisible(chromedp.CSS("#webhook-secret-notice")))
	secret := eval(`document.getElementById('webhook-secret').textContent`)
	id := eval(`document.getElementById('webhook-secret-id').textContent`)
	if !strings.HasPrefix(secret, "whsec_") || !strings.HasPrefix(id, "wh_") {
		t.Fatalf("secret %q of %q", secret, id)
	}
	row := fmt.Sprintf(`#webhooks-body tr[data-id=%q]`, id)
	do("the webhook is listed", chromedp.WaitVisible(chromedp.CSS(row)))
	if got := eval(`document.querySelector('` + row + `').textContent`); !strings.Contains(got, rcv.URL+"/hook") ||
		!strings.Contains(got, "link.created") || strings.Contains(got, secret) {
		t.Errorf("webhook row %q: want the URL and event, never the secret", got)
	}

	for _, path := range []string{"/delivered", "/refused"} {
		createLink(t, gw, key, "https://example.com"+path)
	}

	// Every click that loads the deliveries (open, refresh, a successful
	// redeliver) adds one to data-renders when its load lands. landed waits
	// until all loads started so far have landed, so the rows read next are
	// not replaced by an earlier load still in flight.
	loads := 0
	landed := func(what string) {
		t.Helper()
		do(what, chromedp.Poll[chromedp.Void](
			fmt.Sprintf(`Number(document.getElementById('deliveries').dataset.renders) >= %d`, loads),
			chromedp.WithPollingTimeout(10*time.Second)))
	}
	refresh := func() {
		t.Helper()
		loads++
		do("refresh the deliveries", chromedp.Click(chromedp.CSS("#deliveries-refresh")))
		landed("the deliveries are drawn again")
	}
	statuses := func() string {
		return eval(`[...document.querySelectorAll('#deliveries-body tr')].map((r) => r.dataset.status).sort().join(',')`)
	}
	loads++
	do("open the deliveries", chromedp.Click(chromedp.CSS(row+" button.deliveries")), chromedp.WaitVisible(chromedp.CSS("#deliveries")))
	landed("the deliveries are drawn")
	ok, last := servertest.EventuallyState(20*time.Second, func() (bool, string) {
		refresh()
		got := statuses()
		return got == "dead,succeeded", got
	})
	if !ok {
		t.Fatalf("deliveries %q, want one dead and one succeeded", last)
	}
	if got := eval(`document.querySelector('#deliveries-body tr[data-status="dead"]').textContent`); !strings.Contains(got, "HTTP 503: not today") {
		t.Errorf("dead delivery row %q: want the receiver's answer as the last error", got)
	}

	mu.Lock()
	refuse = false
	mu.Unlock()
	loads++
	do("redeliver the dead one", chromedp.Click(chromedp.CSS(`#deliveries-body tr[data-status="dead"] button.redeliver`)))
	// A refused redelivery draws nothing and says why in deliveries-error.
	do("the redelivery is answered", chromedp.Poll[chromedp.Void](
		fmt.Sprintf(`Number(document.getElementById('deliveries').dataset.renders) >= %d || document.getElementById('deliveries-error').textContent !== ''`, loads),
		chromedp.WithPollingTimeout(10*time.Second)))
	if e := eval(`document.getElementById('deliveries-error').textContent`); e != "" {
		t.Fatalf("redeliver: %s", e)
	}
	ok, last = servertest.EventuallyState(20*time.Second, func() (bool, string) {
		refresh()
		got := statuses()
		return got == "succeeded,succeeded", got
	})
	if !ok {
		t.Fatalf("after redelivery: %q, want both succeeded", last)
	}
	mu.Lock()
	for i, b := range bodies {
		if err := webhooksig.Verify(secret, sigs[i], b, time.Now(), 0); err != nil {
			t.Errorf("delivery %s: signature: %v", b, err)
		}
	}
	mu.Unlock()

	do("delete the webhook",
		chromedp.Click(chromedp.CSS(row+" button.delete")),
		chromedp.WaitVisible(chromedp.CSS("#webhook-confirm-dialog")),
		chromedp.Click(chromedp.CSS("#webhook-confirm-ok")),
		chromedp.WaitVisible(chromedp.CSS("#webhooks-empty")))
}
