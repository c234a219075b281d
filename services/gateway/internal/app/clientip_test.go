//go:build integration

package app

import (
	"crypto/rand"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"testing"

	"kurz.dev/services/gateway/gatewaytest"
)

// Who the client is (pkg/clientip), seen through the brute-force rule (auth
// per-ip on the small-limits rules: 10 failures per 15 minutes, then 429
// even with a valid key). Each case fails ten times as one client, whose
// requests may differ in what they forge, then tries a valid key as that
// same client (refused) and as another client (served). Failures stay in
// the shared Redis for 15 minutes, so every client here is new to each run.
func TestClientIPAuthFailures(t *testing.T) {
	// An address whose /64 is random: the other address of that /64, and
	// one of the next /64.
	guesserIP := netip.MustParseAddr(gatewaytest.NewIP())
	sameNet := netip.AddrFrom16(func() [16]byte { b := guesserIP.As16(); b[15] ^= 0xff; b[8] ^= 0x80; return b }()).String()
	otherNet := netip.AddrFrom16(func() [16]byte { b := guesserIP.As16(); b[7] ^= 1; return b }()).String()
	realIP := gatewaytest.NewIP()
	// The untrusted peer connects from a loopback address of its own: the
	// failures it runs up must not lock out 127.0.0.1, the peer of every
	// other test, for the rule's 15 minutes.
	var b [3]byte
	_, _ = rand.Read(b[:])
	peer := fmt.Sprintf("127.%d.%d.%d", b[0], b[1], 2+b[2]%250)
	for name, tc := range map[string]struct {
		env map[string]string
		// from is the address the requests come from ("": 127.0.0.1).
		from string
		// guesser is the i-th failure's extra header fields; same and other
		// those of the valid key as the guesser and as someone else.
		guesser     func(i int) []string
		same, other []string
	}{
		// The peer is not a trusted proxy: its X-Forwarded-For, however it
		// varies, is ignored, and every failure counts against the peer.
		"spoofed X-Forwarded-For from an untrusted peer is ignored": {
			env:     map[string]string{"KURZ_GATEWAY_TRUSTED_PROXIES": "127.0.0.1"},
			from:    peer,
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
			if tc.from != "" {
				c.http = clientFrom(t, tc.from)
			}
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

// clientFrom returns an HTTP client whose connections come from the local
// address ip (any 127.x.y.z works on Linux).
func clientFrom(t *testing.T, ip string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}
