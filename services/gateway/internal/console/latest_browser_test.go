//go:build integration

package console_test

import (
	"fmt"
	"strings"
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
		signIn(gw.HTTP+"/console", key),
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

// The QR dialog shows only the answer for the link it is open for. A's QR
// code is answered late, after its dialog was closed and B's opened: the
// dialog titled B keeps B's image (no blob: URL is made of A's, none is
// left unrevoked), and a late failure of A's leaves no error under B.
func TestConsoleShowsOnlyTheOpenLinksQR(t *testing.T) {
	s := startStack(t)
	gw := startGateway(t, s)
	_, key := newTenant(t, s, gw)
	codeA := createLink(t, gw, key, "https://example.com/qr-a")
	codeB := createLink(t, gw, key, "https://example.com/qr-b")
	rowA, rowB := fmt.Sprintf(`#links-body tr[data-code=%q]`, codeA), fmt.Sprintf(`#links-body tr[data-code=%q]`, codeB)

	b := startBrowser(t)
	do, eval, text := b.do, b.eval, b.text
	do("sign in",
		signIn(gw.HTTP+"/console", key),
		chromedp.WaitVisible(chromedp.CSS(rowA)), chromedp.WaitVisible(chromedp.CSS(rowB)))

	// A's QR requests wait for releaseA(ok): answered then (ok) or failed.
	// Each blob: URL is recorded with the address its image came from, and
	// whether it was revoked.
	eval(fmt.Sprintf(`(() => {
		const fetch = window.fetch, isA = (url) => String(url).includes('/v1/links/' + %q + '/qr');
		window.aAnswered = 0;
		window.fetch = (url, init) => isA(url)
			? new Promise((resolve, reject) => {
				window.releaseA = (ok) => {
					if (ok) resolve(fetch(url, init));
					else { reject(new TypeError('network down')); window.aAnswered++; }
				};
			})
			: fetch(url, init);
		const from = new WeakMap(), blob = Response.prototype.blob;
		Response.prototype.blob = async function () {
			const b = await blob.call(this);
			from.set(b, this.url);
			if (isA(this.url)) window.aAnswered++;
			return b;
		};
		const create = URL.createObjectURL, revoke = URL.revokeObjectURL;
		window.objectURLs = {};
		URL.createObjectURL = (b) => { const u = create(b); window.objectURLs[u] = { from: from.get(b) || '', live: true }; return u; };
		URL.revokeObjectURL = (u) => { if (window.objectURLs[u]) window.objectURLs[u].live = false; revoke(u); };
		return '';
	})()`, codeA))

	for _, ok := range []bool{true, false} {
		answered := eval(`String(window.aAnswered)`)
		do("open A's QR code, close it, open B's",
			chromedp.Click(chromedp.CSS(rowA+" button.qr")),
			chromedp.WaitVisible(chromedp.CSS("#qr-dialog")),
			chromedp.Click(chromedp.CSS("#qr-close")),
			chromedp.WaitNotVisible(chromedp.CSS("#qr-dialog")),
			chromedp.Click(chromedp.CSS(rowB+" button.qr")),
			chromedp.WaitVisible(chromedp.CSS("#qr-dialog")),
			chromedp.Poll[chromedp.Void](`(() => { const i = document.getElementById('qr-img');
				return i.src.startsWith('blob:') && i.complete && i.naturalWidth > 0; })()`, chromedp.WithPollingTimeout(20*time.Second)))
		do("A's answer lands late",
			chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`window.releaseA(%t)`, ok)),
			chromedp.Poll[chromedp.Void](fmt.Sprintf(`window.aAnswered > %s`, answered), chromedp.WithPollingTimeout(20*time.Second)))

		what := map[bool]string{true: "a late answer", false: "a late failure"}[ok]
		if got := text("#qr-code"); got != codeB {
			t.Fatalf("after %s of A's QR code the dialog is titled %q, want %q", what, got, codeB)
		}
		if got := eval(`window.objectURLs[document.getElementById('qr-img').src].from`); !strings.Contains(got, "/v1/links/"+codeB+"/qr") {
			t.Errorf("after %s of A's QR code the dialog titled B shows the image of %s", what, got)
		}
		if got := eval(`String(Object.values(window.objectURLs).filter((u) => u.live).length)`); got != "1" {
			t.Errorf("after %s of A's QR code %s blob: URLs are live, want 1 (B's, shown)", what, got)
		}
		if got := text("#qr-error"); got != "" {
			t.Errorf("after %s of A's QR code the dialog titled B shows the error %q", what, got)
		}
		do("close B's QR code", chromedp.Click(chromedp.CSS("#qr-close")), chromedp.WaitNotVisible(chromedp.CSS("#qr-dialog")))
	}
}
