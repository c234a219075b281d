//go:build integration

package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"kurz.dev/pkg/server"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/gateway/gatewaytest"
)

// Requests no client library would send (broken request line, invalid
// method or URI, a header line without a colon, 2 MiB of header, ...) get
// net/http's 4xx/5xx and the connection closed, and the gateway goes on
// serving; a body declared over the JSON limit gets the gateway's 413 with
// its JSON error at once, without the gateway waiting for the body.
func TestMalformedHTTPGets4xxAndTheGatewayKeepsServing(t *testing.T) {
	gw := startGateway(t, nil)
	tn := newTenant(t, gw, "free")
	c := newClient(t, gw, tn.key)
	addr := strings.TrimPrefix(gw.HTTP, "http://")
	for _, tc := range servertest.MalformedRequests {
		t.Run(tc.Name, func(t *testing.T) {
			got, err := servertest.RawExchange(addr, tc.Raw, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != tc.Want || !got.Closed {
				t.Errorf("got %d, closed=%v after %v; want %d and the connection closed", got.Status, got.Closed, got.After, tc.Want)
			}
			if r := c.do("GET", "/v1/links?page_size=1", ""); r.code != http.StatusOK {
				t.Errorf("a well-formed request after it: %s; want 200", r)
			}
		})
	}

	t.Run("1 MiB body declared, none sent", func(t *testing.T) {
		head := fmt.Sprintf("POST /v1/links HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nX-Forwarded-For: %s\r\n"+
			"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n", tn.key, c.ip, 1<<20)
		got, err := servertest.RawExchange(addr, head, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Code, Detail string }
		if err := json.Unmarshal([]byte(got.Body), &body); err != nil {
			t.Errorf("413 body %q: %v", got.Body, err)
		}
		if got.Status != http.StatusRequestEntityTooLarge || body.Code != "PAYLOAD_TOO_LARGE" || !got.Closed || got.After > 2*time.Second {
			t.Errorf("got %d %q, closed=%v after %v; want 413 PAYLOAD_TOO_LARGE at once and the connection closed",
				got.Status, got.Body, got.Closed, got.After)
		}
	})
}

// While 50 clients trickle their headers (slowloris) and 5 trickle their
// bodies, a well-behaved client's API calls all succeed; each slow header is
// cut at ReadHeaderTimeout and each slow body at ReadTimeout (the gateway
// answers 400: the body could not be read), and the goroutines the attack
// took are given back.
func TestSlowClientsAreCutWhileOthersAreServed(t *testing.T) {
	const (
		headerTimeout = time.Second
		readTimeout   = 2 * time.Second
		// margin absorbs a loaded machine under the race detector; without
		// the timeouts nothing would close before the attackers give up at
		// giveUp.
		margin = 2 * time.Second
		giveUp = 10 * time.Second
	)
	gw := startGateway(t, nil, func(c *Config) {
		c.HTTP = server.HTTPLimits{ReadHeaderTimeout: headerTimeout, ReadTimeout: readTimeout}
	})
	tn := newTenant(t, gw, "free")
	addr := strings.TrimPrefix(gw.HTTP, "http://")
	normal := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}
	ip := gatewaytest.NewIP()
	call := func() (int, time.Duration, error) {
		req, err := http.NewRequest("GET", gw.HTTP+"/v1/links?page_size=1", nil)
		if err != nil {
			return 0, 0, err
		}
		req.Header.Set("Authorization", "Bearer "+tn.key)
		req.Header.Set("X-Forwarded-For", ip)
		start := time.Now()
		resp, err := normal.Do(req)
		if err != nil {
			return 0, 0, err
		}
		_ = resp.Body.Close()
		return resp.StatusCode, time.Since(start), nil
	}
	if code, _, err := call(); code != http.StatusOK {
		t.Fatalf("warm-up call: %d %v", code, err)
	}
	baseline := runtime.NumGoroutine()

	var slowHeaders, slowBodies []servertest.RawResponse
	var headerErr, bodyErr error
	var attack sync.WaitGroup
	attack.Go(func() {
		slowHeaders, headerErr = servertest.TrickleMany(50, addr, "GET /v1/links HTTP/1.1\r\nHost: x\r\n", "X-Slow: 1\r\n", 100*time.Millisecond, giveUp)
	})
	attack.Go(func() {
		head := fmt.Sprintf("POST /v1/links HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nX-Forwarded-For: %s\r\n"+
			"Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n", tn.key, ip)
		slowBodies, bodyErr = servertest.TrickleMany(5, addr, head, " ", 200*time.Millisecond, giveUp)
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
		code, took, err := call()
		if code != http.StatusOK {
			t.Errorf("call %d during the attack: %d %v; want 200", calls+1, code, err)
		}
		calls++
		slowest = max(slowest, took)
		peak = max(peak, runtime.NumGoroutine())
	}
	if headerErr != nil || bodyErr != nil {
		t.Fatalf("attackers: %v %v", headerErr, bodyErr)
	}
	for _, r := range slowHeaders {
		if !r.Closed || r.After < headerTimeout || r.After > headerTimeout+margin || (r.Status != 0 && r.Status != http.StatusBadRequest) {
			t.Errorf("slow header: %d closed=%v after %v; want closed in [%v, %v], with no answer or a bare 400",
				r.Status, r.Closed, r.After, headerTimeout, headerTimeout+margin)
		}
	}
	for _, r := range slowBodies {
		if !r.Closed || r.After < readTimeout || r.After > readTimeout+margin || r.Status != http.StatusBadRequest || !strings.Contains(r.Body, "could not be read") {
			t.Errorf("slow body: %d %q closed=%v after %v; want 400 \"could not be read\" and closed in [%v, %v]",
				r.Status, r.Body, r.Closed, r.After, readTimeout, readTimeout+margin)
		}
	}
	if calls < 3 {
		t.Errorf("%d calls during the attack; want the normal client to keep going", calls)
	}
	after, ok := servertest.AwaitGoroutines(baseline, 10*time.Second)
	if !ok {
		t.Errorf("goroutines: %d before the attack, %d at its peak, still %d 10 s after it", baseline, peak, after)
	}
	hLo, hHi := servertest.AfterRange(slowHeaders)
	bLo, bHi := servertest.AfterRange(slowBodies)
	t.Logf("slow headers cut after %v..%v (ReadHeaderTimeout %v); slow bodies after %v..%v (ReadTimeout %v); "+
		"%d normal calls during the attack, slowest %v; goroutines %d before, %d at peak, %d after",
		hLo, hHi, headerTimeout, bLo, bHi, readTimeout, calls, slowest.Round(time.Millisecond), baseline, peak, after)
}
