//go:build integration

package app

import (
	"context"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"kurz.dev/pkg/server"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/servertest"
)

// startLimited boots a redirect pod (fake allow-all limiter, testSalt) with
// these bounds on its HTTP listener.
func startLimited(t *testing.T, limits server.HTTPLimits) instance {
	t.Helper()
	cfg := load(t, map[string]string{
		"KURZ_REDIRECT_VISITOR_SALT": testSalt,
		"KURZ_LIMITER_GRPC_ADDR":     limitertest.Start(t, limitertest.AllowAll).Addr(),
	})
	cfg.HTTP = limits
	srv, err := build(context.Background(), cfg, servertest.Logger(t), hooks{})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "")
	return instance{Running: r, cfg: cfg}
}

// Requests no client library would send (broken request line, invalid
// method or URI, a header line without a colon, 2 MiB of header, ...) get
// net/http's 4xx/5xx and the connection closed, and the redirects go on; a
// request declaring a 1 MiB body is answered at once and its connection
// closed, the body never waited for.
func TestMalformedHTTPGets4xxAndRedirectsGoOn(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	f.insert(code, "badinput", "https://example.com/badinput", 0, nil, false)
	r := startLimited(t, server.HTTPLimits{})
	addr := strings.TrimPrefix(r.HTTP, "http://")
	for _, tc := range servertest.MalformedRequests {
		t.Run(tc.Name, func(t *testing.T) {
			got, err := servertest.RawExchange(addr, tc.Raw, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != tc.Want || !got.Closed {
				t.Errorf("got %d, closed=%v after %v; want %d and the connection closed", got.Status, got.Closed, got.After, tc.Want)
			}
			if resp := get(t, r.HTTP, "/"+code); resp.StatusCode != http.StatusFound {
				t.Errorf("a redirect after it: %d; want 302", resp.StatusCode)
			}
		})
	}
	t.Run("1 MiB body declared, none sent", func(t *testing.T) {
		got, err := servertest.RawExchange(addr, "GET /"+code+" HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != http.StatusFound || !got.Closed || got.After > 2*time.Second {
			t.Errorf("got %d, closed=%v after %v; want 302 at once and the connection closed", got.Status, got.Closed, got.After)
		}
	})
}

// While 50 clients trickle their headers (slowloris) and 5 trickle a body,
// a well-behaved client's redirects all succeed; each slow header is cut at
// ReadHeaderTimeout; a redirect reads no body, so each slow one gets its
// 302 at once and its connection closed (net/http would otherwise read the
// rest, up to ReadTimeout, before answering), and the goroutines the
// attack took are given back.
func TestSlowClientsAreCutWhileRedirectsAreServed(t *testing.T) {
	const (
		headerTimeout = time.Second
		readTimeout   = 2 * time.Second
		// margin absorbs a loaded machine under the race detector; without
		// the timeouts nothing would close before the attackers give up.
		margin = 2 * time.Second
		giveUp = 10 * time.Second
	)
	f := newFixture(t)
	code := f.code()
	f.insert(code, "badinput", "https://example.com/badinput", 0, nil, false)
	r := startLimited(t, server.HTTPLimits{ReadHeaderTimeout: headerTimeout, ReadTimeout: readTimeout})
	addr := strings.TrimPrefix(r.HTTP, "http://")
	normal := &http.Client{
		Timeout:       5 * time.Second,
		Transport:     &http.Transport{},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	call := func() (int, time.Duration, error) {
		start := time.Now()
		resp, err := normal.Get(r.HTTP + "/" + code)
		if err != nil {
			return 0, 0, err
		}
		_ = resp.Body.Close()
		return resp.StatusCode, time.Since(start), nil
	}
	if st, _, err := call(); st != http.StatusFound {
		t.Fatalf("warm-up redirect: %d %v", st, err)
	}
	baseline := runtime.NumGoroutine()

	var slowHeaders, slowBodies []servertest.RawResponse
	var headerErr, bodyErr error
	var attack sync.WaitGroup
	attack.Go(func() {
		slowHeaders, headerErr = servertest.TrickleMany(50, addr, "GET /"+code+" HTTP/1.1\r\nHost: x\r\n", "X-Slow: 1\r\n", 100*time.Millisecond, giveUp)
	})
	attack.Go(func() {
		slowBodies, bodyErr = servertest.TrickleMany(5, addr, "GET /"+code+" HTTP/1.1\r\nHost: x\r\nContent-Length: 4096\r\n\r\n", "x", 200*time.Millisecond, giveUp)
	})
	attacked := make(chan struct{})
	go func() { attack.Wait(); close(attacked) }()

	// The normal client paces itself (one call per 20 ms), as a client
	// does; the attackers are what must not starve it.
	pace := time.NewTicker(20 * time.Millisecond)
	defer pace.Stop()
	var calls, peak int
	var slowest time.Duration
	for done := false; !done; {
		select {
		case <-attacked:
			done = true
		case <-pace.C:
		}
		status, took, err := call()
		if status != http.StatusFound {
			t.Errorf("redirect %d during the attack: %d %v; want 302", calls+1, status, err)
		}
		calls++
		slowest = max(slowest, took)
		peak = max(peak, runtime.NumGoroutine())
	}
	if headerErr != nil || bodyErr != nil {
		t.Fatalf("attackers: %v %v", headerErr, bodyErr)
	}
	for _, s := range slowHeaders {
		if !s.Closed || s.After < headerTimeout || s.After > headerTimeout+margin || (s.Status != 0 && s.Status != http.StatusBadRequest) {
			t.Errorf("slow header: %d closed=%v after %v; want closed in [%v, %v], with no answer or a bare 400",
				s.Status, s.Closed, s.After, headerTimeout, headerTimeout+margin)
		}
	}
	for _, s := range slowBodies {
		if !s.Closed || s.After > margin || s.Status != http.StatusFound {
			t.Errorf("slow body: %d closed=%v after %v; want 302 and closed within %v, long before ReadTimeout %v", s.Status, s.Closed, s.After, margin, readTimeout)
		}
	}
	if calls < 3 {
		t.Errorf("%d redirects during the attack; want the normal client to keep going", calls)
	}
	after, ok := servertest.AwaitGoroutines(baseline, 10*time.Second)
	if !ok {
		t.Errorf("goroutines: %d before the attack, %d at its peak, still %d 10 s after it", baseline, peak, after)
	}
	hLo, hHi := servertest.AfterRange(slowHeaders)
	bLo, bHi := servertest.AfterRange(slowBodies)
	t.Logf("slow headers cut after %v..%v (ReadHeaderTimeout %v); slow bodies answered and closed after %v..%v (ReadTimeout %v); "+
		"%d redirects during the attack, slowest %v; goroutines %d before, %d at peak, %d after",
		hLo, hHi, headerTimeout, bLo, bHi, readTimeout, calls, slowest.Round(time.Millisecond), baseline, peak, after)
}
