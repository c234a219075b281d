//go:build integration

package app

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"kurz.dev/pkg/linkcache"
)

// TestWalkingExistingCodesIsBoundedPerIP: the codes are existing links, in
// Redis like any link the shortener made. One client IP that looks up more
// distinct codes than the walk bound's burst (5, refilled once in 1,000 s)
// gets 429 with Retry-After for the next one, and the refusal is counted;
// another IP gets that code's redirect. A visitor clicking one code 20
// times, each time after another IP pushed it out of L1 (1 entry), so that
// every click reaches the walk bound, is never refused.
func TestWalkingExistingCodesIsBoundedPerIP(t *testing.T) {
	const burst = 5
	f := newFixture(t)
	r := start(t, map[string]string{"KURZ_REDIRECT_TRUSTED_PROXIES": "127.0.0.1/32,::1",
		"KURZ_REDIRECT_WALK_BURST": strconv.Itoa(burst), "KURZ_REDIRECT_WALK_RATE": "0.001", "KURZ_REDIRECT_L1_SIZE": "1"}, hooks{})
	link := func() string {
		code := f.code()
		target := "https://example.com/walk/" + code
		f.insert(code, "t", target, 0, nil, false)
		e := linkcache.Entry{State: linkcache.Active, URL: target, Tenant: "t"}
		if err := linkcache.Fill(context.Background(), f.rdb, code, e, time.Minute, ""); err != nil { // no invalidation: L1 takes it
			t.Fatal(err)
		}
		return code
	}
	from := func(ip, code string) (int, string) {
		resp := get(t, r.HTTP, "/"+code, "X-Forwarded-For", ip)
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}

	const walker, other = "203.0.113.7", "203.0.113.8"
	codes := make([]string, burst+1)
	for i := range codes {
		codes[i] = link()
	}
	for i, code := range codes[:burst] {
		if status, _ := from(walker, code); status != 302 {
			t.Fatalf("walker's lookup %d of %d: %d, want 302", i+1, burst, status)
		}
	}
	status, retry := from(walker, codes[burst])
	if status != 429 || retry == "" {
		t.Errorf("walker's lookup %d: %d (Retry-After %q), want 429 with Retry-After", burst+1, status, retry)
	}
	if status, _ := from(other, codes[burst]); status != 302 {
		t.Errorf("another IP, the same code: %d, want 302", status)
	}
	if got := metricValue(t, r.Running, "kurz_redirect_walk_refused_total"); got != 1 {
		t.Errorf("walk refusals metric %v, want 1", got)
	}

	const visitor = "198.51.100.9"
	popular := link()
	for i := range 4 * burst {
		// A fresh IP reads another code, which takes popular's L1 place.
		if status, _ := from(fmt.Sprintf("192.0.2.%d", i+1), link()); status != 302 {
			t.Fatalf("evicting lookup %d: %d, want 302", i, status)
		}
		resp := get(t, r.HTTP, "/"+popular, "X-Forwarded-For", visitor)
		if resp.StatusCode != 302 || resp.Header.Get("X-Source") == "l1" {
			t.Fatalf("visitor's click %d on one code: %d from %q, want 302 from past L1", i+1, resp.StatusCode, resp.Header.Get("X-Source"))
		}
	}
}
