//go:build integration

package app

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/testkit/servertest"
)

// startForwardAuth boots the limiter in-process on the real Redis Cluster
// with the forward auth on and the rules of rulesPath, its Redis keys
// under a prefix of the test's own: a client address is the same on every
// run, its counters start afresh.
func startForwardAuth(t *testing.T, rulesPath string) *servertest.Running {
	t.Helper()
	return startWith(t, map[string]string{
		"KURZ_LIMITER_RULES_SOURCE":     "file",
		"KURZ_LIMITER_RULES_FILE":       rulesPath,
		"KURZ_LIMITER_FORWARD_AUTH":     "true",
		"KURZ_LIMITER_REDIS_KEY_PREFIX": fmt.Sprintf("fwdauth-%d:", time.Now().UnixNano()),
	})
}

// proxyHeaders are the headers each proxy's forward-auth request carries
// for a GET /account of client (the address it took the request from),
// forgeries of the other proxies' headers included, which each passes on
// from the client.
func proxyHeaders(proxy, client string) http.Header {
	forged := http.Header{
		"X-Forwarded-For": {"198.51.100.250"}, "X-Real-Ip": {"198.51.100.251"},
		"X-Forwarded-Uri": {"/elsewhere"}, "X-Original-Url": {"https://other.example/elsewhere"},
	}
	var h http.Header
	switch proxy {
	case "nginx": // the README's recipe
		h = http.Header{"X-Original-Url": {"https://shop.example/account"}, "X-Original-Method": {"GET"}, "X-Real-Ip": {client}}
	case "ingress-nginx": // its auth location, compute-full-forwarded-for on
		h = http.Header{"X-Original-Url": {"https://shop.example/account"}, "X-Original-Method": {"GET"}, "X-Real-Ip": {client},
			"X-Forwarded-For": {"198.51.100.250, 10.0.0.2"}, "X-Sent-From": {"nginx-ingress-controller"}, "X-Auth-Request-Redirect": {"/account"}}
	case "traefik": // trustForwardHeader: the client's chain, then the peer
		h = http.Header{"X-Forwarded-Method": {"GET"}, "X-Forwarded-Uri": {"/account"}, "X-Forwarded-Host": {"shop.example"},
			"X-Forwarded-Proto": {"https"}, "X-Forwarded-For": {"198.51.100.250, " + client}}
	case "caddy": // no trusted_proxies: the peer alone
		h = http.Header{"X-Forwarded-Method": {"GET"}, "X-Forwarded-Uri": {"/account"}, "X-Forwarded-Host": {"shop.example"},
			"X-Forwarded-Proto": {"https"}, "X-Forwarded-For": {client}, "Via": {"1.1 Caddy"}}
	}
	for k, v := range forged {
		if _, set := h[k]; !set {
			h[k] = v
		}
	}
	return h
}

// The fwdauth domain's rule, 3 an hour per client address, decided on
// Redis through the forward auth: exactly 3 requests of a client pass,
// each with the rule's RateLimit and X-RateLimit fields counting down; the
// 4th is 429 with a Retry-After (403 with deny_status=403), nothing
// consumed; another client is not touched. The decisions are counted as
// every other, and the requests under the route's pattern, never a value.
func TestForwardAuthCountsExactlyOnRedis(t *testing.T) {
	r := startForwardAuth(t, rulesFile(t))
	url := r.HTTP + "/forward-auth/fwdauth?from=traefik&d=remote_address"
	for i := range 3 {
		resp, body := askForwardAuth(t, url, proxyHeaders("traefik", "203.0.113.7"))
		left := strconv.Itoa(2 - i)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %q, want 200", i+1, resp.StatusCode, body)
		}
		wantFields(t, fmt.Sprintf("request %d", i+1), resp.Header, map[string]string{
			"RateLimit-Policy":  `"fwdauth/per-ip";q=3;w=3600`,
			"RateLimit":         `"fwdauth/per-ip";r=` + left + ";t=",
			"X-RateLimit-Limit": `3, 3;w=3600;name="per-ip"`, "X-RateLimit-Remaining": left,
			"Retry-After": "",
		})
	}
	for deny, code := range map[string]int{"": http.StatusTooManyRequests, "&deny_status=403": http.StatusForbidden} {
		resp, body := askForwardAuth(t, url+deny, proxyHeaders("traefik", "203.0.113.7"))
		if resp.StatusCode != code || body != "rate limit exceeded\n" {
			t.Errorf("over the limit%s: %d %q, want %d, rate limit exceeded", deny, resp.StatusCode, body, code)
		}
		// 3 an hour: the next in 20 minutes at most.
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 || s > 1200 {
			t.Errorf("over the limit%s: Retry-After %q, want 1 to 1200 s", deny, resp.Header.Get("Retry-After"))
		}
		wantFields(t, "over the limit"+deny, resp.Header, map[string]string{
			"RateLimit": `"fwdauth/per-ip";r=0;t=`, "X-RateLimit-Remaining": "0",
		})
	}
	if resp, body := askForwardAuth(t, url, proxyHeaders("traefik", "203.0.113.8")); resp.StatusCode != http.StatusOK {
		t.Errorf("another client: %d %q, want 200", resp.StatusCode, body)
	}

	var metrics string
	ok, _ := servertest.EventuallyState(5*time.Second, func() (bool, string) {
		_, metrics = r.Get(t, "/metrics")
		return servertest.HasSeries(metrics, "http_server_request_duration_seconds_count", `http_route="/forward-auth/{domain}"`, `http_response_status_code="429"`), ""
	})
	if !ok {
		t.Errorf("/metrics has no http_server_request_duration_seconds_count series of route /forward-auth/{domain}, status 429")
	}
	for _, outcome := range []string{"allowed", "denied"} {
		if !servertest.HasSeries(metrics, "kurz_ratelimit_decisions_total", `domain="fwdauth"`, `rule="per-ip"`, `outcome="`+outcome+`"`) {
			t.Errorf("/metrics has no kurz_ratelimit_decisions_total series of fwdauth/per-ip, outcome %s", outcome)
		}
	}
	if strings.Contains(metrics, "203.0.113.7") {
		t.Error("/metrics names a client address")
	}
}

// One client through each proxy, every request carrying that proxy's
// headers (and the client's forgeries of the others'): all four name the
// same client, so its 3 an hour are spent by the first three proxies'
// requests and the fourth's is refused.
func TestForwardAuthCountsOneClientThroughEveryProxy(t *testing.T) {
	r := startForwardAuth(t, rulesFile(t))
	for i, proxy := range []string{"nginx", "ingress-nginx", "traefik", "caddy"} {
		resp, body := askForwardAuth(t, r.HTTP+"/forward-auth/fwdauth?d=remote_address&from="+proxy, proxyHeaders(proxy, "2001:db8:7:7::1"))
		want := http.StatusOK
		if i == 3 {
			want = http.StatusTooManyRequests
		}
		if resp.StatusCode != want || resp.Header.Get("X-RateLimit-Remaining") != strconv.Itoa(max(0, 2-i)) {
			t.Errorf("through %s: %d (X-RateLimit-Remaining %q) %q, want %d with %d remaining",
				proxy, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), body, want, max(0, 2-i))
		}
	}
}

// wantFields checks h's fields (a client's, canonical): want's value
// whole, or its prefix when it ends in "=" ("" for absent).
func wantFields(t *testing.T, what string, h http.Header, want map[string]string) {
	t.Helper()
	for k, v := range want {
		got := strings.Join(h.Values(k), ", ")
		if got != v && !(strings.HasSuffix(v, "=") && strings.HasPrefix(got, v)) {
			t.Errorf("%s: %s %q, want %q", what, k, got, v)
		}
	}
}
