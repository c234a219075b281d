//go:build integration

package console_test

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"kurz.dev/pkg/geoip/geoiptest"
)

// A daily chart's buckets are UTC days, and are labelled with their UTC
// dates, under an axis that says so, in a browser west of UTC too (where
// every UTC midnight is the evening before, local time).
func TestConsoleLabelsDaysInUTC(t *testing.T) {
	const zone = "America/Los_Angeles"
	s := startStack(t)
	gw := startGateway(t, s)
	_, key := newTenant(t, s, gw)
	code := createLink(t, gw, key, "https://example.com/days")

	b := startBrowser(t, chromedp.Env("TZ="+zone))
	do, eval, text := b.do, b.eval, b.text
	renders := `Number(document.getElementById('view-stats').dataset.renders || 0)`
	do("sign in and open the link's stats",
		signIn(gw.HTTP+"/console/#/stats/"+code, key),
		chromedp.Poll[chromedp.Void](renders+` > 0`, chromedp.WithPollingTimeout(20*time.Second)))
	if got := eval(`Intl.DateTimeFormat().resolvedOptions().timeZone`); got != zone {
		t.Fatalf("the browser's time zone is %s, want %s", got, zone)
	}
	n := eval(`String(` + renders + `)`)
	do("the last 30 days",
		chromedp.Evaluate[chromedp.Void](`(() => { const r = document.getElementById('stats-range');
			r.value = '30d'; r.dispatchEvent(new Event('change')); })()`),
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`%s > %s`, renders, n), chromedp.WithPollingTimeout(20*time.Second)))
	if e := text("#stats-error"); e != "" {
		t.Fatalf("stats error: %s", e)
	}

	// Each time label follows its bucket, on the line of the first one's
	// (the axis title, after the last bucket, is below): "Dec 6" for
	// 2026-12-06T00:00:00Z.
	labels := eval(`(() => {
		const gs = [...document.querySelectorAll('#chart g.bucket')];
		const label = (g) => g.nextElementSibling && g.nextElementSibling.tagName === 'text' ? g.nextElementSibling : null;
		const y = gs.length && label(gs[0]) ? label(gs[0]).getAttribute('y') : '';
		return gs.filter((g) => label(g) && label(g).getAttribute('y') === y)
			.map((g) => g.dataset.start + '=' + label(g).textContent).join('\n');
	})()`)
	if labels == "" {
		t.Fatalf("the daily chart has no time labels")
	}
	day := regexp.MustCompile(`(\d+)$`)
	for _, l := range strings.Split(labels, "\n") {
		start, label, _ := strings.Cut(l, "=")
		st, err := time.Parse(time.RFC3339, start)
		if err != nil {
			t.Fatalf("label %q: bucket start: %v", l, err)
		}
		if !st.Equal(st.Truncate(24 * time.Hour)) {
			t.Errorf("bucket starting %s: not a UTC day", start)
		}
		m := day.FindStringSubmatch(label)
		if m == nil {
			t.Errorf("the day starting %s (UTC) is labelled %q, with no day of the month", start, label)
		} else if d, _ := strconv.Atoi(m[1]); d != st.UTC().Day() {
			t.Errorf("the day starting %s (UTC) is labelled %q, want its UTC date, day %d", start, label, st.UTC().Day())
		}
	}
	axis := eval(`[...document.querySelectorAll('#chart svg > text')].map((t) => t.textContent).filter((s) => /local|UTC/.test(s)).join(', ')`)
	if !strings.Contains(axis, "UTC") || strings.Contains(axis, "local") {
		t.Errorf("the daily chart's time axis is titled %q, want it to say the days are UTC", axis)
	}
}

// The stats view says what its tables count. A link only bots opened
// shows them in the totals, and breakdowns (human clicks only) that say
// there is no human click, not no click. A human click from an address
// the redirect's GeoIP database does not place is counted as "(unknown)",
// without a guess that the redirect has no database.
func TestConsoleStatsSayWhatTheyCount(t *testing.T) {
	s := startStack(t)
	gw := startGateway(t, s)
	_, key := newTenant(t, s, gw)
	botsOnly := createLink(t, gw, key, "https://example.com/bots-only")
	unplaced := createLink(t, gw, key, "https://example.com/unplaced")
	for range 3 {
		if st, _ := visit(t, s.redirectURL+"/"+botsOnly, botUA, "", geoiptest.IPv4DE); st != http.StatusFound {
			t.Fatalf("bot visit of %s: %d, want 302", botsOnly, st)
		}
	}
	if st, _ := visit(t, s.redirectURL+"/"+unplaced, humanUA, "", geoiptest.IPv4Unknown); st != http.StatusFound {
		t.Fatalf("visit of %s: %d, want 302", unplaced, st)
	}

	b := startBrowser(t)
	do, eval, text := b.do, b.eval, b.text
	do("sign in",
		signIn(gw.HTTP+"/console", key),
		chromedp.WaitVisible(chromedp.CSS("#view-links")))
	renders := `Number(document.getElementById('view-stats').dataset.renders || 0)`
	field := func(name string) string { return text(fmt.Sprintf(`#stats-totals td[data-field=%q]`, name)) }
	// statsOf opens code's stats, refreshed until the consumer stored its
	// total clicks.
	statsOf := func(code, total string) {
		t.Helper()
		n := eval(`String(` + renders + `)`)
		do("open the stats of "+code,
			chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`location.hash = '#/stats/%s'`, code)),
			chromedp.Poll[chromedp.Void](fmt.Sprintf(`%s > %s`, renders, n), chromedp.WithPollingTimeout(20*time.Second)))
		deadline := time.Now().Add(90 * time.Second)
		for field("total") != total {
			if time.Now().After(deadline) {
				t.Fatalf("the stats of %s show total %q (error %q), want %s", code, field("total"), text("#stats-error"), total)
			}
			time.Sleep(300 * time.Millisecond) // the poll interval of a person pressing Refresh
			n := eval(`String(` + renders + `)`)
			do("refresh the stats", chromedp.Click(chromedp.CSS("#stats-refresh")),
				chromedp.Poll[chromedp.Void](fmt.Sprintf(`%s > %s`, renders, n), chromedp.WithPollingTimeout(20*time.Second)))
		}
	}

	statsOf(botsOnly, "3")
	if got := field("human"); got != "0" {
		t.Fatalf("the bots-only link shows %s human clicks", got)
	}
	if got := text("#view-stats"); !strings.Contains(got, "human clicks only") {
		t.Errorf("the stats view does not say its breakdowns count human clicks only")
	}
	for _, table := range []string{"#stats-referrers", "#stats-browsers", "#stats-devices", "#stats-os", "#stats-countries", "#stats-rules", "#stats-variants"} {
		if got := text(table); got != "No human clicks in this range" {
			t.Errorf("%s of a link with 3 bot clicks: %q, want No human clicks in this range", table, got)
		}
	}

	statsOf(unplaced, "1")
	if got := text("#stats-countries"); got != "(unknown)1" {
		t.Errorf("countries of a click from an address the GeoIP database does not place: %q, want (unknown)1", got)
	}
}

// The links list shows each link's clicks (bots included) in its Clicks
// column, filled from one POST /v1/links:clickCounts after the list
// renders: refreshed until the consumer stored the clicks, the clicked
// link shows them and the other 0. When that call fails, the column says
// "–" and the list is shown all the same, without an error.
func TestConsoleListsClicks(t *testing.T) {
	s := startStack(t)
	gw := startGateway(t, s)
	_, key := newTenant(t, s, gw)
	quiet := createLink(t, gw, key, "https://example.com/quiet")
	clicked := createLink(t, gw, key, "https://example.com/clicked")
	for _, ua := range []string{humanUA, humanUA, botUA} {
		if st, _ := visit(t, s.redirectURL+"/"+clicked, ua, "", geoiptest.IPv4DE); st != http.StatusFound {
			t.Fatalf("visit of %s: %d, want 302", clicked, st)
		}
	}

	b := startBrowser(t)
	do, eval, text := b.do, b.eval, b.text
	fills := `Number(document.getElementById('links-table').dataset.clicks || 0)`
	// reload shows the first page again and waits for its clicks.
	reload := func(what string) {
		t.Helper()
		n := eval(`String(` + fills + `)`)
		do(what, chromedp.Click(chromedp.CSS("#filter-form button[type=submit]")),
			chromedp.Poll[chromedp.Void](fmt.Sprintf(`%s > %s`, fills, n), chromedp.WithPollingTimeout(20*time.Second)))
	}
	clicks := func(code string) string { return text(fmt.Sprintf(`#links-body tr[data-code=%q] td.clicks`, code)) }
	do("sign in",
		signIn(gw.HTTP+"/console", key),
		chromedp.WaitVisible(chromedp.CSS("#view-links")),
		chromedp.Poll[chromedp.Void](fills+` > 0`, chromedp.WithPollingTimeout(20*time.Second)))
	deadline := time.Now().Add(90 * time.Second)
	for clicks(clicked) != "3" {
		if time.Now().After(deadline) {
			t.Fatalf("the list shows %q clicks for %s, want 3", clicks(clicked), clicked)
		}
		time.Sleep(300 * time.Millisecond) // the poll interval of a person reloading the list
		reload("reload the list")
	}
	if got := clicks(quiet); got != "0" {
		t.Errorf("the list shows %q clicks for %s, never clicked; want 0", got, quiet)
	}
	if got := eval(`document.querySelector('#links-table thead').textContent`); !strings.Contains(got, "Clicks") {
		t.Errorf("the list's header is %q, want a Clicks column", got)
	}

	// The click counts' call fails (the page's fetch answers 503 for it).
	do("fail the click counts", chromedp.Evaluate[chromedp.Void](`(() => { const f = window.fetch;
		window.fetch = (p, init) => String(p).includes(':clickCounts')
			? Promise.resolve(new Response('', { status: 503, statusText: 'Service Unavailable' })) : f(p, init); })()`))
	reload("reload the list without click counts")
	for _, code := range []string{clicked, quiet} {
		if got := clicks(code); got != "–" {
			t.Errorf("without click counts the list shows %q for %s, want –", got, code)
		}
	}
	if got := text("#links-error"); got != "" {
		t.Errorf("without click counts the list shows the error %q, want none", got)
	}
}
