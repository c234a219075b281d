//go:build integration

package app

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/geoip/geoiptest"
)

// streamEvents reads, from every click stream shard, the events of code
// written since since.
func streamEvents(t *testing.T, rdb *redis.ClusterClient, shards int, code string, since time.Time) (map[string][]clickevent.Event, int) {
	t.Helper()
	byShard := map[string][]clickevent.Event{}
	total := 0
	for _, key := range clickevent.StreamKeys(shards) {
		msgs, err := rdb.XRange(context.Background(), key, strconv.FormatInt(since.UnixMilli(), 10), "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if m.Values[clickevent.FieldCode] != code {
				continue
			}
			e, err := clickevent.Parse(m.Values)
			if err != nil {
				t.Fatalf("%s %s: %v", key, m.ID, err)
			}
			byShard[key] = append(byShard[key], e)
			total++
		}
	}
	return byShard, total
}

// TestClicks: N redirects give N events in the streams, each with every
// field; HEAD, 404 and 410 give none; shutdown flushes the buffer.
func TestClicks(t *testing.T) {
	const n = 60
	f := newFixture(t)
	code, gone := f.code(), f.code()
	f.insert(code, "acme", "https://example.com/clicked", 0, nil, false)
	f.insert(gone, "acme", "https://example.com/gone", 0, nil, true)
	since := time.Now().Add(-time.Second)
	r := start(t, map[string]string{"KURZ_REDIRECT_TRUSTED_PROXIES": "127.0.0.1/32,::1",
		"KURZ_REDIRECT_CLICK_FLUSH_INTERVAL": "20ms"}, hooks{})

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	for i := range n {
		resp := get(t, r.HTTP, "/"+code,
			"User-Agent", "kurz-test/1.0",
			"Referer", "https://news.example/item?id="+strconv.Itoa(i),
			"X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i%4),
			"traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
		if resp.StatusCode != http.StatusFound {
			t.Fatalf("redirect %d: %d", i, resp.StatusCode)
		}
	}
	do(t, http.MethodHead, r.HTTP+"/"+code)
	get(t, r.HTTP, "/"+gone)
	get(t, r.HTTP, "/"+f.code())
	until := time.Now()
	if err := r.Stop(); err != nil { // flushes the buffer
		t.Fatal(err)
	}

	byShard, total := streamEvents(t, f.rdb, r.cfg.Streams.Shards, code, since)
	if total != n {
		t.Fatalf("%d events for %d redirects (HEAD and errors must not count)", total, n)
	}
	if _, goneTotal := streamEvents(t, f.rdb, r.cfg.Streams.Shards, gone, since); goneTotal != 0 {
		t.Errorf("%d events for a 410", goneTotal)
	}
	uuid7 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	ids := map[string]bool{}
	refs := map[string]bool{}
	visitors := map[string]bool{}
	for _, events := range byShard {
		for _, e := range events {
			if !uuid7.MatchString(e.ID) || ids[e.ID] {
				t.Errorf("event ID %q: want a fresh UUIDv7", e.ID)
			}
			ids[e.ID] = true
			if e.Tenant != "acme" || e.UserAgent != "kurz-test/1.0" || e.Time.Before(since) || e.Time.After(until) {
				t.Errorf("event %+v: tenant, user agent or time wrong", e)
			}
			// This redirect records no spans (no exporter): the click
			// goes on in the caller's trace, as a child of the caller's
			// span (with an exporter, of the redirect's: TestTraceRedirectClick).
			if e.TraceParent != "00-"+traceID+"-00f067aa0ba902b7-01" {
				t.Errorf("traceparent %q: want the caller's", e.TraceParent)
			}
			refs[e.Referrer] = true
			visitors[e.Visitor] = true
			ok := false
			for i := range 4 {
				if e.Visitor == clickevent.Visitor([]byte(testSalt), e.Time, fmt.Sprintf("203.0.113.%d", i), "kurz-test/1.0") {
					ok = true
				}
			}
			if !ok {
				t.Errorf("visitor %q is not the salted hash of a client IP and user agent", e.Visitor)
			}
		}
	}
	if len(refs) != n || len(visitors) != 4 {
		t.Errorf("%d distinct referrers (want %d), %d distinct visitors (want 4)", len(refs), n, len(visitors))
	}
	t.Logf("%d events over %d shards", total, len(byShard))
}

// blackHole accepts TCP connections and never answers: a Redis that hangs.
func blackHole(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		var conns []net.Conn
		for {
			c, err := lis.Accept()
			if err != nil {
				for _, c := range conns {
					c.Close()
				}
				close(done)
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() { lis.Close(); <-done })
	return lis.Addr().String()
}

// TestBrokenClickStreamDoesNotSlowRedirects points the click writers at a
// Redis that accepts connections and never answers: redirects stay fast and
// successful, events are dropped and counted.
func TestBrokenClickStreamDoesNotSlowRedirects(t *testing.T) {
	const n = 100
	const writeTimeout = 3 * time.Second
	f := newFixture(t)
	code := f.code()
	f.insert(code, "acme", "https://example.com/fast", 0, nil, false)
	dead := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{blackHole(t)}, DialTimeout: writeTimeout, ReadTimeout: writeTimeout, WriteTimeout: writeTimeout,
		MaxRetries: -1,
	})
	defer dead.Close()
	r := start(t, map[string]string{
		"KURZ_REDIRECT_CLICK_BUFFER": "4", "KURZ_REDIRECT_CLICK_BATCH": "2",
		"KURZ_REDIRECT_CLICK_FLUSH_INTERVAL": "10ms", "KURZ_REDIRECT_CLICK_WRITE_TIMEOUT": writeTimeout.String(),
	}, hooks{clickRedis: dead})

	get(t, r.HTTP, "/"+code) // fill Redis: the timing below is about the click path only
	began := time.Now()
	var slowest time.Duration
	for i := range n {
		t0 := time.Now()
		resp := get(t, r.HTTP, "/"+code)
		if d := time.Since(t0); d > slowest {
			slowest = d
		}
		if resp.StatusCode != http.StatusFound {
			t.Fatalf("redirect %d with a broken stream: %d", i, resp.StatusCode)
		}
	}
	elapsed := time.Since(began)
	// One redirect waiting on one stream write would take writeTimeout.
	if slowest >= writeTimeout/2 || elapsed >= writeTimeout {
		t.Errorf("%d redirects took %v (slowest %v) with the stream hanging for %v per write", n, elapsed, slowest, writeTimeout)
	}
	dropped := metricValue(t, r.Running, "kurz_redirect_click_events_dropped_total", `reason="buffer_full"`)
	// Only what fits in the buffer (4) and in the hung writers' batches
	// (8 shards x 2) escapes the drop.
	if held := 4 + r.cfg.Streams.Shards*2; dropped < float64(n-held) {
		t.Errorf("dropped (buffer full) %v of %d events, want at least %d", dropped, n+1, n-held)
	}
	t.Logf("%d redirects in %v (slowest %v) while the stream hung; %v events dropped as buffer_full", n, elapsed.Round(time.Millisecond), slowest.Round(time.Millisecond), dropped)
}

// TestClicksCarryCountry: with KURZ_GEOIP_DB, each click carries the
// country of its client (the trusted proxy's X-Forwarded-For), never its
// address; a client the database does not know, or that it maps to no
// country code, gets "". Without a database every click's country is "".
func TestClicksCarryCountry(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	f.insert(code, "acme", "https://example.com/geo", 0, nil, false)
	since := time.Now().Add(-time.Second)
	env := map[string]string{"KURZ_REDIRECT_TRUSTED_PROXIES": "127.0.0.1/32,::1", "KURZ_REDIRECT_CLICK_FLUSH_INTERVAL": "20ms"}
	clients := map[string]string{
		geoiptest.IPv4DE: "DE", geoiptest.IPv4RegisteredFR: "FR", geoiptest.IPv6JP: "JP",
		geoiptest.IPv4Bad: "", geoiptest.IPv4Unknown: "",
	}
	visit := func(r instance) {
		for ip := range clients {
			if resp := get(t, r.HTTP, "/"+code, "X-Forwarded-For", ip, "User-Agent", "geo/"+ip); resp.StatusCode != http.StatusFound {
				t.Fatalf("redirect for %s: %d", ip, resp.StatusCode)
			}
		}
		if err := r.Stop(); err != nil { // flushes the buffer
			t.Fatal(err)
		}
	}

	env["KURZ_GEOIP_DB"] = geoiptest.Write(t, nil)
	r := start(t, env, hooks{})
	// The fixture was built just now (build epoch in whole seconds).
	if age := metricValue(t, r.Running, "kurz_redirect_geoip_age_seconds"); age <= 0 || age > 600 {
		t.Errorf("kurz_redirect_geoip_age_seconds = %v, want the fixture's few seconds", age)
	}
	visit(r)
	byShard, total := streamEvents(t, f.rdb, r.cfg.Streams.Shards, code, since)
	if total != len(clients) {
		t.Fatalf("%d events for %d redirects", total, len(clients))
	}
	for _, events := range byShard {
		for _, e := range events {
			ip := strings.TrimPrefix(e.UserAgent, "geo/")
			if want := clients[ip]; e.Country != want {
				t.Errorf("click from %s: country %q, want %q", ip, e.Country, want)
			}
		}
	}

	delete(env, "KURZ_GEOIP_DB")
	since = time.Now()
	r = start(t, env, hooks{})
	visit(r)
	byShard, total = streamEvents(t, f.rdb, r.cfg.Streams.Shards, code, since)
	if total != len(clients) {
		t.Fatalf("without a database: %d events for %d redirects", total, len(clients))
	}
	for _, events := range byShard {
		for _, e := range events {
			if e.Country != "" {
				t.Errorf("without a database: click from %s has country %q", e.UserAgent, e.Country)
			}
		}
	}
}
