//go:build integration

package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
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
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("Chromium is needed for the console's browser test and is not installed (%v): apt-get install chromium", err)
	}
	s := startStack(t)
	gw := startGateway(t, s)
	key := newTenant(t, s, gw)

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

	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1280, 1000))...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(allocCtx)
	defer cancel()
	var problems []string
	messages := chromedp.Console(ctx)
	listening := make(chan struct{})
	go func() {
		defer close(listening)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.IsException() || m.Source == "security" || strings.Contains(m.Text, "Content Security Policy") {
				mu.Lock()
				problems = append(problems, m.String())
				mu.Unlock()
			}
		}
	}()
	defer func() {
		cancel()
		<-listening
		for _, p := range problems {
			t.Errorf("browser console: %s", p)
		}
	}()
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(expr string) string {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		v, err := chromedp.Run(sctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("evaluate %s: %v", expr, err)
		}
		return v
	}

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
		req, _ := http.NewRequest(http.MethodPost, gw.HTTP+"/v1/links", strings.NewReader(`{"longUrl":"https://example.com`+path+`"}`))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("create link: %v %v", resp, err)
		}
		resp.Body.Close()
	}

	statuses := func() string {
		return eval(`[...document.querySelectorAll('#deliveries-body tr')].map((r) => r.dataset.status).sort().join(',')`)
	}
	do("open the deliveries", chromedp.Click(chromedp.CSS(row+" button.deliveries")), chromedp.WaitVisible(chromedp.CSS("#deliveries")))
	ok, last := servertest.EventuallyState(20*time.Second, func() (bool, string) {
		do("refresh", chromedp.Click(chromedp.CSS("#deliveries-refresh")))
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
	do("redeliver the dead one", chromedp.Click(chromedp.CSS(`#deliveries-body tr[data-status="dead"] button.redeliver`)))
	ok, last = servertest.EventuallyState(20*time.Second, func() (bool, string) {
		do("refresh", chromedp.Click(chromedp.CSS("#deliveries-refresh")))
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
