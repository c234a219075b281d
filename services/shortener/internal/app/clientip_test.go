//go:build integration

package app

import (
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/testkit/limitertest"
)

// The quota's client IP is keyed as at the gateway (pkg/clientip): two
// addresses of one IPv6 /64 are one client, as are an IPv4 address and its
// IPv4-mapped form; another /64 is another client. The limiter here allows
// one link per ip descriptor, so the second link of one client is refused.
func TestQuotaKeysIPv6ClientsByPrefix(t *testing.T) {
	var mu sync.Mutex
	used := map[string]bool{}
	onePerIP := func(req *ratelimitv1.CheckQuotaRequest) *ratelimitv1.CheckQuotaResponse {
		mu.Lock()
		defer mu.Unlock()
		ip := req.GetDescriptors()["ip"]
		if used[ip] {
			return limitertest.Deny("per-ip", 0)(req)
		}
		used[ip] = true
		return limitertest.AllowAll(req)
	}
	tenant := uniq("v6-")
	lim := limitertest.Start(t, onePerIP)
	sh := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.Addr()}, hooks{})
	stores(t, sh.cfg, tenant)

	create := func(ip string) codes.Code {
		t.Helper()
		_, err := sh.api.CreateLink(as(tenant, ip), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/v6"})
		return status.Code(err)
	}
	for _, step := range []struct {
		ip   string
		want codes.Code
	}{
		{"2001:db8:77:1::1", codes.OK},
		{"2001:db8:77:1:ffff:ffff:ffff:ffff", codes.ResourceExhausted}, // same /64
		{"2001:db8:77:2::1", codes.OK},                                 // next /64
		{"203.0.113.78", codes.OK},
		{"::ffff:203.0.113.78", codes.ResourceExhausted}, // its IPv4-mapped form
		{"203.0.113.79", codes.OK},
	} {
		if got := create(step.ip); got != step.want {
			t.Errorf("link from %s: %s, want %s", step.ip, got, step.want)
		}
	}
	seen := map[string]bool{}
	for _, c := range lim.Calls() {
		seen[c.GetDescriptors()["ip"]] = true
	}
	for _, want := range []string{"2001:db8:77:1::/64", "2001:db8:77:2::/64", "203.0.113.78", "203.0.113.79"} {
		if !seen[want] {
			t.Errorf("the limiter never saw ip %q; it saw %v", want, seen)
		}
	}
}
