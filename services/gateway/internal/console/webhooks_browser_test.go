//go:build integration

package console_test

import (
	"encoding/json"
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
		signIn(gw.HTTP+"/console", key),
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

// A dead delivery older than the first page of deliveries is within reach
// of the console's Redeliver button: through the "Dead only" filter (the
// API's status filter), and through Next (the API's page token). The
// receiver refuses the first of 21 events (the console's pages hold 20,
// newest first).
func TestConsoleReachesOlderDeadDeliveries(t *testing.T) {
	s := startStack(t)
	gw := startGateway(t, s)
	_, key := newTenant(t, s, gw)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b, _ := io.ReadAll(r.Body); strings.Contains(string(b), "/refused") {
			http.Error(w, "not today", http.StatusServiceUnavailable)
		}
	}))
	defer rcv.Close()
	id := createWebhook(t, gw, key, rcv.URL+"/hook")
	createLink(t, gw, key, "https://example.com/refused")
	for i := range 20 {
		createLink(t, gw, key, fmt.Sprintf("https://example.com/delivered/%d", i))
	}

	b := startBrowser(t)
	do, eval := b.do, b.eval
	do("sign in and open the webhooks",
		signIn(gw.HTTP+"/console#/webhooks", key),
		chromedp.Click(chromedp.CSS("#nav-webhooks")),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#webhooks-body tr[data-id=%q] button.deliveries`, id))))
	loads := 0
	// load runs steps that load the deliveries once, and waits for it.
	load := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		loads++
		do(what, append(steps, chromedp.Poll[chromedp.Void](
			fmt.Sprintf(`Number(document.getElementById('deliveries').dataset.renders) >= %d`, loads),
			chromedp.WithPollingTimeout(10*time.Second)))...)
	}
	load("open the deliveries", chromedp.Click(chromedp.CSS(fmt.Sprintf(`#webhooks-body tr[data-id=%q] button.deliveries`, id))))
	rows := func() string {
		return eval(`[...document.querySelectorAll('#deliveries-body tr')].map((r) => r.dataset.status).join(',')`)
	}
	if eval(`String(!!document.getElementById('deliveries-dead') && !!document.getElementById('deliveries-next'))`) != "true" {
		t.Fatalf("the deliveries have no dead-only filter or no Next button; shown: %q", rows())
	}

	// Dead only: the refused event, once the sender has given it up.
	load("show the dead deliveries only", chromedp.Click(chromedp.CSS("#deliveries-dead")))
	ok, last := servertest.EventuallyState(30*time.Second, func() (bool, string) {
		load("refresh the deliveries", chromedp.Click(chromedp.CSS("#deliveries-refresh")))
		got := rows()
		return got == "dead", got
	})
	if !ok {
		t.Fatalf("dead only: %q, want the one dead delivery", last)
	}
	if n := eval(`String(document.querySelectorAll('#deliveries-body button.redeliver').length)`); n != "1" {
		t.Errorf("dead only: %s Redeliver buttons, want 1", n)
	}

	// All: the first page holds the 20 newest, delivered; Next the dead one.
	load("show all deliveries", chromedp.Click(chromedp.CSS("#deliveries-dead")))
	if got := rows(); got != strings.TrimSuffix(strings.Repeat("succeeded,", 20), ",") {
		t.Fatalf("the first page: %q, want the 20 newest, succeeded", got)
	}
	load("the next page", chromedp.Click(chromedp.CSS("#deliveries-next")))
	if got := rows(); got != "dead" {
		t.Fatalf("the second page: %q, want the oldest, dead", got)
	}
	if eval(`String(document.getElementById('deliveries-next').disabled)`) != "true" {
		t.Errorf("Next is enabled on the last page")
	}
	if n := eval(`String(document.querySelectorAll('#deliveries-body button.redeliver').length)`); n != "1" {
		t.Errorf("the second page: %s Redeliver buttons, want 1", n)
	}
	load("the first page again", chromedp.Click(chromedp.CSS("#deliveries-prev")))
	if got := rows(); !strings.HasPrefix(got, "succeeded,") || strings.Contains(got, "dead") {
		t.Errorf("Previous: %q, want the first page again", got)
	}
}

// createWebhook subscribes url to link.created through the public API
// with key and returns the subscription's id.
func createWebhook(t *testing.T, gw *servertest.Running, key, url string) string {
	t.Helper()
	status, b := postJSON(t, gw, key, "/v1/webhooks", fmt.Sprintf(`{"url":%q,"events":["link.created"]}`, url))
	var out struct{ Webhook struct{ ID string } }
	if status != http.StatusCreated || json.Unmarshal(b, &out) != nil || out.Webhook.ID == "" {
		t.Fatalf("create webhook: %d %s", status, b)
	}
	return out.Webhook.ID
}
