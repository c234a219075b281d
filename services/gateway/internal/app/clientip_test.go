package app

import (
	"maps"
	"net/http"
	"net/netip"
	"strconv"
	"testing"

	"kurz.dev/services/gateway/internal/gatewaytest"
)

// Who the client is (pkg/clientip), seen through the brute-force rule (auth
// per-ip on the small-limits rules: 10 failures per 15 minutes, then 429
// even with a valid key). Each case fails ten times as one client, whose
// requests may differ in what they forge, then tries a valid key as that
// same client (refused) and as another client (served). Each case has its
// own limiter, so the peer 127.0.0.1 counts for that case only.
func TestClientIPAuthFailures(t *testing.T) {
	// An address whose /64 is random: the other address of that /64, and
	// one of the next /64.
	guesserIP := netip.MustParseAddr(gatewaytest.NewIP())
	sameNet := netip.AddrFrom16(func() [16]byte { b := guesserIP.As16(); b[15] ^= 0xff; b[8] ^= 0x80; return b }()).String()
	otherNet := netip.AddrFrom16(func() [16]byte { b := guesserIP.As16(); b[7] ^= 1; return b }()).String()
	realIP := gatewaytest.NewIP()
	for name, tc := range map[string]struct {
		env map[string]string
		// guesser is the i-th failure's extra header fields; same and other
		// those of the valid key as the guesser and as someone else.
		guesser     func(i int) []string
		same, other []string
	}{
		// The peer is not a trusted proxy: its X-Forwarded-For, however it
		// varies, is ignored, and every failure counts against the peer.
		"spoofed X-Forwarded-For from an untrusted peer is ignored": {
			env:     map[string]string{"KURZ_GATEWAY_TRUSTED_PROXIES": "192.0.2.1"},
			guesser: func(i int) []string { return []string{"X-Forwarded-For", gatewaytest.NewIP()} },
			same:    []string{"X-Forwarded-For", gatewaytest.NewIP()},
		},
		// One /64 is one client: rotating through it does not reset the
		// failures; the next /64 is someone else.
		"addresses in one IPv6 /64 share a limit": {
			guesser: func(i int) []string {
				b := guesserIP.As16()
				b[15] = byte(i)
				return []string{"X-Forwarded-For", netip.AddrFrom16(b).String()}
			},
			same:  []string{"X-Forwarded-For", sameNet},
			other: []string{"X-Forwarded-For", otherNet},
		},
		// A trusted proxy's single-value header names the client; the
		// X-Forwarded-For it also carries is not read.
		"X-Real-IP from a trusted proxy names the client": {
			env: map[string]string{"KURZ_GATEWAY_CLIENT_IP_HEADER": "X-Real-IP"},
			guesser: func(i int) []string {
				return []string{"X-Real-IP", realIP, "X-Forwarded-For", "198.51.100." + strconv.Itoa(10+i)}
			},
			same:  []string{"X-Real-IP", realIP, "X-Forwarded-For", "198.51.100.99"},
			other: []string{"X-Real-IP", gatewaytest.NewIP(), "X-Forwarded-For", "198.51.100.10"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			lim := startLimiter(t)
			env := map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.GRPCAddr, "KURZ_GATEWAY_LIMITER_TIMEOUT": "500ms"}
			maps.Copy(env, tc.env)
			gw := startGateway(t, env)
			tn := newTenant(t, gw, "free")
			const unknownKey = "kurz_AAAAAAAAAAAA_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
			// The client's own X-Forwarded-For is removed: each case says
			// which headers its requests carry.
			c := newClient(t, gw, unknownKey)
			for i := range 10 {
				if r := c.do("GET", "/v1/links", "", append([]string{"X-Forwarded-For", ""}, tc.guesser(i)...)...); r.code != http.StatusUnauthorized {
					t.Fatalf("bad key, attempt %d (%q): %s; want 401", i+1, tc.guesser(i), r)
				}
			}
			if r := c.with(tn.key).do("GET", "/v1/links", "", append([]string{"X-Forwarded-For", ""}, tc.same...)...); r.code != http.StatusTooManyRequests {
				t.Errorf("valid key from the guessing client (%q): %s; want 429", tc.same, r)
			}
			if tc.other == nil {
				return
			}
			if r := c.with(tn.key).do("GET", "/v1/links", "", append([]string{"X-Forwarded-For", ""}, tc.other...)...); r.code != http.StatusOK {
				t.Errorf("valid key from another client (%q): %s; want 200", tc.other, r)
			}
		})
	}
}
