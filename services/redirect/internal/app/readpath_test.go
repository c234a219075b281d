//go:build integration

package app

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/services/shortener/shortenertest"
)

// TestImplausibleCodeIsAnswered404WithoutIO: a path that cannot be a code
// reaches neither Redis, nor PostgreSQL, nor the limiter, and the page
// reflects nothing from the request.
func TestImplausibleCodeIsAnswered404WithoutIO(t *testing.T) {
	newFixture(t)
	pg, rc := &lookups{}, &redisCounter{}
	lim := limitertest.Start(t, limitertest.AllowAll)
	r := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.Addr()}, hooks{pgTracer: pg, redisHook: rc})
	before := rc.total()
	for _, path := range []string{"/abc", "/<script>alert(1)</script>", "/favicon.ico", "/" + strings.Repeat("a", 33),
		"/a.b.c.d", "/10000g8/extra", "/", "/%F0%9F%98%80%F0%9F%98%80"} {
		resp := get(t, r.HTTP, path)
		body := resp.Header.Get("X-Test-Body")
		if resp.StatusCode != http.StatusNotFound || resp.Header.Get("X-Source") != "" {
			t.Errorf("GET %s: %d X-Source %q, want 404 without X-Source", path, resp.StatusCode, resp.Header.Get("X-Source"))
		}
		if strings.Contains(body, "script") || strings.Contains(body, "favicon") || strings.Contains(body, "extra") {
			t.Errorf("GET %s: page reflects the request: %q", path, body)
		}
	}
	after := rc.total()
	if pg.total() != 0 || after != before || len(lim.Calls()) != 0 {
		t.Errorf("implausible codes caused I/O: %d PostgreSQL lookups, %d Redis commands, %d limiter calls", pg.total(), after-before, len(lim.Calls()))
	}
	if resp := do(t, http.MethodPost, r.HTTP+"/abcd1234"); resp.StatusCode != http.StatusMethodNotAllowed && resp.StatusCode != http.StatusNotFound {
		t.Errorf("POST /code: %d", resp.StatusCode)
	}
	// A code's other methods are 405 (a live link is not "no such
	// link"), with no lookup; TRACE and implausible codes stay 404.
	pgBefore, rcBefore := pg.total(), rc.total()
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{http.MethodDelete, "/abcd1234", http.StatusMethodNotAllowed},
		{http.MethodPut, "/abcd1234", http.StatusMethodNotAllowed},
		{http.MethodOptions, "/abcd1234", http.StatusMethodNotAllowed},
		{http.MethodTrace, "/abcd1234", http.StatusNotFound},
		{http.MethodDelete, "/a.b.c", http.StatusNotFound},
		{http.MethodPut, "/healthz", http.StatusNotFound}, // no code: a path of ours
	} {
		resp := do(t, tc.method, r.HTTP+tc.path)
		if resp.StatusCode != tc.want || (tc.want == http.StatusMethodNotAllowed && resp.Header.Get("Allow") == "") {
			t.Errorf("%s %s: %d Allow %q, want %d", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), tc.want)
		}
	}
	if pg.total() != pgBefore || rc.total() != rcBefore {
		t.Errorf("other methods caused lookups: %d PostgreSQL, %d Redis", pg.total()-pgBefore, rc.total()-rcBefore)
	}
}

// TestRequestCollapsing: N concurrent first requests for one code (in no
// cache) make one PostgreSQL query and one Redis read. The lookup is held in
// PostgreSQL until every request has missed L1, so they really overlap.
func TestRequestCollapsing(t *testing.T) {
	const n = 300
	f := newFixture(t)
	code := f.code()
	f.insert(code, "viral", "https://example.com/viral", 0, nil, false)

	pg := &lookups{hold: make(chan struct{})}
	rc := &redisCounter{}
	var arrived atomic.Int64
	var release sync.Once
	// Every request comes from 127.0.0.1, on a connection of its own: more
	// than one client may hold by default.
	r := start(t, map[string]string{"KURZ_HTTP_MAX_CONNECTIONS_PER_CLIENT": strconv.Itoa(2 * n)}, hooks{pgTracer: pg, redisHook: rc, beforeFlight: func(c string) {
		if c == code && arrived.Add(1) == n {
			release.Do(func() { close(pg.hold) })
		}
	}})

	sources := make(chan string, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			resp := get(t, r.HTTP, "/"+code)
			if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "https://example.com/viral" {
				t.Errorf("GET: %d %q", resp.StatusCode, resp.Header.Get("Location"))
			}
			sources <- resp.Header.Get("X-Source")
		})
	}
	wg.Wait()
	close(sources)
	bySource := map[string]int{}
	for s := range sources {
		bySource[s]++
	}
	if got := pg.count(code); got != 1 {
		t.Errorf("%d concurrent requests made %d PostgreSQL queries, want 1", n, got)
	}
	// A request that missed L1 just as the lookup finished starts its own,
	// which finds the entry in Redis: one more read at most, never a query.
	if got := rc.count("get", linkcache.Key(code)); got < 1 || got > 2 {
		t.Errorf("%d concurrent requests made %d Redis reads, want 1 (2 with a straggler)", n, got)
	}
	if bySource["db"] < n-1 {
		t.Errorf("sources %v: want (nearly) all %d answered by the one PostgreSQL lookup", bySource, n)
	}
	// Every request but the leader joined its lookup (a straggler may lead
	// a second one); the leader is never counted.
	if got := metricValue(t, r.Running, "kurz_redirect_lookups_collapsed_total"); got < n-2 || got > n-1 {
		t.Errorf("collapsed metric %v, want %d (%d with a straggler)", got, n-1, n-2)
	}
	t.Logf("%d requests: sources %v, %d PostgreSQL query, %d Redis GET", n, bySource, pg.count(code), rc.count("get", linkcache.Key(code)))
}

// TestRevocationAcrossPods: after DeleteLink, every redirect pod answers 410
// within the L1 TTL, although each had the link in its L1.
func TestRevocationAcrossPods(t *testing.T) {
	f := newFixture(t)
	const l1TTL = 10 * time.Second
	pods := []instance{
		start(t, map[string]string{"KURZ_REDIRECT_L1_TTL": l1TTL.String()}, hooks{}),
		start(t, map[string]string{"KURZ_REDIRECT_L1_TTL": l1TTL.String()}, hooks{}),
	}
	sh := shortenertest.Start(t, map[string]string{
		"KURZ_LIMITER_GRPC_ADDR": limitertest.Start(t, limitertest.AllowAll).Addr(),
	})
	api := shortenerv1.NewShortenerServiceClient(sh.Conn)
	ctx := callmeta.Outgoing(context.Background(), "revoke-test", "")
	made, err := api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/phishy"})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()
	f.track(code)
	for i, p := range pods {
		// Warm each pod until its L1 answers.
		await(t, "pod warm", 5*time.Second, func() bool {
			resp := get(t, p.HTTP, "/"+code)
			if resp.StatusCode != http.StatusFound {
				t.Fatalf("pod %d: %d before revocation", i, resp.StatusCode)
			}
			return resp.Header.Get("X-Source") == "l1"
		})
	}
	deleted := time.Now()
	if _, err := api.DeleteLink(ctx, &shortenerv1.DeleteLinkRequest{Code: code}); err != nil {
		t.Fatal(err)
	}
	for i, p := range pods {
		took := await(t, "pod stops redirecting", l1TTL-time.Since(deleted), func() bool {
			return get(t, p.HTTP, "/"+code).StatusCode == http.StatusGone
		})
		resp := get(t, p.HTTP, "/"+code)
		t.Logf("pod %d: 410 %v after DeleteLink returned (L1 TTL %v); now X-Source %s", i, took.Round(time.Millisecond), l1TTL, resp.Header.Get("X-Source"))
		if resp.StatusCode != http.StatusGone || resp.Header.Get("Location") != "" {
			t.Errorf("pod %d after revocation: %d Location %q", i, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	// A pod that never saw the link answers 410 too, after a cache flush.
	// Which tier answers first is not fixed here: any shortener replica
	// sharing this database may retry the queued invalidation and write the
	// tombstone back after the flush, which is correct.
	f.flush(code)
	fresh := start(t, nil, hooks{})
	for range 2 {
		if resp := get(t, fresh.HTTP, "/"+code); resp.StatusCode != http.StatusGone || resp.Header.Get("Location") != "" {
			t.Errorf("fresh pod: %d %s Location %q, want 410", resp.StatusCode, resp.Header.Get("X-Source"), resp.Header.Get("Location"))
		}
	}
	// The tiers in order, on a link deleted in PostgreSQL alone (no queued
	// invalidation, so nothing else writes its entry): PostgreSQL, then the
	// tombstone it left in Redis.
	gone := f.code()
	f.insert(gone, "t", "https://example.com/gone", 0, nil, false)
	if _, err := f.db.Exec(context.Background(), `UPDATE links SET deleted_at = now() WHERE code = $1`, gone); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"db", "cache"} {
		if resp := get(t, fresh.HTTP, "/"+gone); resp.StatusCode != http.StatusGone || resp.Header.Get("X-Source") != want {
			t.Errorf("fresh pod, deleted link: %d %s, want 410 from %s", resp.StatusCode, resp.Header.Get("X-Source"), want)
		}
	}
}

// TestAnswers: per-link and configured redirect statuses, their
// Cache-Control, HEAD, expired and disabled links.
func TestAnswers(t *testing.T) {
	f := newFixture(t)
	past := time.Now().Add(-time.Minute)
	future := time.Now().Add(time.Hour)
	plain, perm, temp, expired, later, disabled := f.code(), f.code(), f.code(), f.code(), f.code(), f.code()
	f.insert(plain, "t", "https://example.com/plain", 0, nil, false)
	f.insert(perm, "t", "https://example.com/perm", 301, nil, false)
	f.insert(temp, "t", "https://example.com/temp", 307, nil, false)
	f.insert(expired, "t", "https://example.com/old", 0, &past, false)
	f.insert(later, "t", "https://example.com/later", 0, &future, false)
	f.insert(disabled, "t", "https://example.com/off", 0, nil, true)

	r := start(t, nil, hooks{})
	tests := []struct {
		code, method string
		status       int
		cache        string
	}{
		{plain, http.MethodGet, 302, "private, max-age=0"},
		{plain, http.MethodHead, 302, "private, max-age=0"},
		{perm, http.MethodGet, 301, "public, max-age=3600"},
		{temp, http.MethodGet, 307, "private, max-age=0"},
		{expired, http.MethodGet, 410, "private, max-age=0"},
		{later, http.MethodGet, 302, "private, max-age=0"},
		{disabled, http.MethodGet, 410, "private, max-age=0"},
	}
	for _, tc := range tests {
		resp := do(t, tc.method, r.HTTP+"/"+tc.code)
		if resp.StatusCode != tc.status || resp.Header.Get("Cache-Control") != tc.cache {
			t.Errorf("%s /%s: %d %q, want %d %q", tc.method, tc.code, resp.StatusCode, resp.Header.Get("Cache-Control"), tc.status, tc.cache)
		}
		if tc.status == 410 && (strings.Contains(resp.Header.Get("X-Test-Body"), "example.com") || resp.Header.Get("Location") != "") {
			t.Errorf("410 page leaks the target: %q", resp.Header.Get("X-Test-Body"))
		}
	}

	cdn := start(t, map[string]string{"KURZ_REDIRECT_DEFAULT_STATUS": "308", "KURZ_REDIRECT_CDN_MAX_AGE": "5s",
		"KURZ_REDIRECT_PERMANENT_MAX_AGE": "10m"}, hooks{})
	if resp := get(t, cdn.HTTP, "/"+plain); resp.StatusCode != 308 || resp.Header.Get("Cache-Control") != "public, max-age=600" {
		t.Errorf("configured default 308: %d %q", resp.StatusCode, resp.Header.Get("Cache-Control"))
	}
	if resp := get(t, cdn.HTTP, "/"+temp); resp.StatusCode != 307 || resp.Header.Get("Cache-Control") != "public, max-age=5" {
		t.Errorf("307 with a CDN max-age: %d %q", resp.StatusCode, resp.Header.Get("Cache-Control"))
	}
}

// TestCachingEndsWithTheLink: no cacheable redirect (301/308, 302/307 with
// a CDN max-age, a permanent link's per-device answer) may be kept past its
// link's expiry: max-age is the whole seconds left when that is less than
// the configured one. A link that outlives it keeps the configured value.
func TestCachingEndsWithTheLink(t *testing.T) {
	f := newFixture(t)
	soon := time.Now().Add(30 * time.Second).Truncate(time.Millisecond)
	far := time.Now().Add(48 * time.Hour)
	perm, temp, device, later := f.code(), f.code(), f.code(), f.code()
	f.insert(perm, "t", "https://example.com/perm", 301, &soon, false)
	f.insert(temp, "t", "https://example.com/temp", 307, &soon, false)
	f.insertLink(device, "https://example.com/device", features{status: 308, ios: "https://example.com/ios", expires: soon})
	f.insert(later, "t", "https://example.com/later", 301, &far, false)

	r := start(t, map[string]string{"KURZ_REDIRECT_CDN_MAX_AGE": "1m"}, hooks{})
	for _, tc := range []struct {
		code, scope string
		status      int
	}{{perm, "public", 301}, {temp, "public", 307}, {device, "private", 308}} {
		before := time.Now()
		resp := get(t, r.HTTP, "/"+tc.code)
		after := time.Now()
		cc := resp.Header.Get("Cache-Control")
		age, ok := strings.CutPrefix(cc, tc.scope+", max-age=")
		n, err := strconv.Atoi(age)
		lo, hi := int(soon.Sub(after)/time.Second), int(soon.Sub(before)/time.Second)
		if resp.StatusCode != tc.status || !ok || err != nil || n < lo || n > hi {
			t.Errorf("/%s expiring in 30 s: %d %q, want %d and %s, max-age=%d..%d", tc.code, resp.StatusCode, cc, tc.status, tc.scope, lo, hi)
		}
	}
	if resp := get(t, r.HTTP, "/"+later); resp.StatusCode != 301 || resp.Header.Get("Cache-Control") != "public, max-age=3600" {
		t.Errorf("301 expiring in 48 h: %d %q, want public, max-age=3600", resp.StatusCode, resp.Header.Get("Cache-Control"))
	}
}

// TestMissPathRateLimited: the limiter is asked (per client IP) only when a
// lookup must go to PostgreSQL; a scanner gets 429 with Retry-After, while
// cached links redirect without any limiter call.
func TestMissPathRateLimited(t *testing.T) {
	f := newFixture(t)
	cached, uncached := f.code(), f.code()
	f.insert(cached, "t", "https://example.com/cached", 0, nil, false)
	f.insert(uncached, "t", "https://example.com/uncached", 0, nil, false)
	lim := limitertest.Start(t, limitertest.AllowAll)
	r := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.Addr(), "KURZ_REDIRECT_TRUSTED_PROXIES": "127.0.0.1/32,::1"}, hooks{})
	if resp := get(t, r.HTTP, "/"+cached); resp.StatusCode != 302 { // fills Redis
		t.Fatalf("warm: %d", resp.StatusCode)
	}
	warmCalls := len(lim.Calls())

	lim.SetDecider(limitertest.Deny("per-ip", 2300*time.Millisecond))
	scanner := []string{"X-Forwarded-For", "10.9.9.9, 203.0.113.50"}
	for i := range 3 {
		unknown := f.code()
		resp := get(t, r.HTTP, "/"+unknown, scanner...)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "3" {
			t.Errorf("scan %d: %d Retry-After %q, want 429 and 3", i, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	if resp := get(t, r.HTTP, "/"+uncached, scanner...); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("existing but uncached code from a limited IP: %d, want 429 (the database is protected)", resp.StatusCode)
	}
	calls := lim.Calls()
	for _, c := range calls[warmCalls:] {
		if c.GetDomain() != "redirect.miss" || c.GetDescriptors()["ip"] != "203.0.113.50" {
			t.Errorf("limiter call %v, want redirect.miss for ip 203.0.113.50 (the right-most untrusted X-Forwarded-For hop)", c)
		}
	}
	before := len(calls)
	for range 5 {
		if resp := get(t, r.HTTP, "/"+cached, scanner...); resp.StatusCode != 302 {
			t.Errorf("cached link while limited: %d", resp.StatusCode)
		}
	}
	if got := len(lim.Calls()); got != before {
		t.Errorf("cached redirects called the limiter %d times, want 0", got-before)
	}

	closed := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": "127.0.0.1:1", "KURZ_REDIRECT_MISS_FAILURE_POLICY": "closed"}, hooks{})
	if resp := get(t, closed.HTTP, "/"+f.code()); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("limiter down, fail-closed miss path: %d, want 503", resp.StatusCode)
	}
	open := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": "127.0.0.1:1"}, hooks{})
	if resp := get(t, open.HTTP, "/"+f.code()); resp.StatusCode != http.StatusNotFound {
		t.Errorf("limiter down, fail-open miss path: %d, want 404", resp.StatusCode)
	}
}

// A stored URL whose query holds non-ASCII characters (the shortener keeps
// them as written) is sent as a URI: Location percent-encodes them.
func TestLocationIsASCII(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	f.insert(code, "utf8", "https://xn--bcher-kva.example/%C3%BC?ä=ö", 0, nil, false)
	r := start(t, nil, hooks{})
	resp := get(t, r.HTTP, "/"+code)
	if want := "https://xn--bcher-kva.example/%C3%BC?%C3%A4=%C3%B6"; resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != want {
		t.Errorf("GET: %d Location %q, want 302 %q", resp.StatusCode, resp.Header.Get("Location"), want)
	}
}
