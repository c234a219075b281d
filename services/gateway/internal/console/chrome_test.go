//go:build integration

package console_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// browser is a headless Chromium for one test. Exceptions and CSP
// violations its pages log, from its start on, fail the test when it ends.
type browser struct {
	t   *testing.T
	ctx context.Context
}

// startBrowser starts Chromium, with opts beyond the usual ones (its
// environment, say); it stops when the test ends.
func startBrowser(t *testing.T, opts ...chromedp.ExecAllocatorOption) *browser {
	t.Helper()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("Chromium is needed for the console's browser test and is not installed (%v): "+
			"deploy/local/infra.sh up installs it (make up and make test run it), or apt-get install chromium", err)
	}
	options := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1280, 1000))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(options, opts...)...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	// Start it here, once: a start that failed (slow under load) left the
	// context without a browser, the test's next step started a second
	// one on the same context, and chromedp v0.23.1 closed the context's
	// "allocated" channel twice when both exited: a panic that took the
	// package down in a CI run.
	if err := chromedp.Do(ctx); err != nil {
		cancel()
		cancelAlloc()
		t.Fatalf("Chromium did not start: %v", err)
	}

	// Started on ctx itself: a browser started on a step's timeout context
	// would end with that step.
	var (
		mu       sync.Mutex
		problems []string
	)
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
	t.Cleanup(func() {
		cancel()
		<-listening
		cancelAlloc()
		for _, p := range problems {
			t.Errorf("browser console: %s", p)
		}
	})
	return &browser{t: t, ctx: ctx}
}

// do runs steps, within 30 s, or fails the test naming what.
func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	sctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(sctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// eval is the string a JavaScript expression evaluates to.
func (b *browser) eval(expr string) string {
	b.t.Helper()
	sctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(sctx, chromedp.Evaluate[string](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// text is the text of the first element sel matches ("" for none).
func (b *browser) text(sel string) string {
	b.t.Helper()
	return b.eval(fmt.Sprintf(`(document.querySelector(%q) || {}).textContent || ''`, sel))
}

// signIn opens the console at url and signs in with key: the actions up
// to the click on Sign in, for the caller to wait for what it expects.
func signIn(url, key string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS("#signin-key")),
		chromedp.SendKeys(chromedp.CSS("#signin-key"), key),
		chromedp.Click(chromedp.CSS("#signin-submit")),
	)
}
