//go:build integration

package app

import (
	"crypto/rand"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"testing"
)

// Who the client is (pkg/clientip), seen through the per-IP limit of
// password attempts: the real limiter with testdata/rules.yaml, 5 attempts
// per client IP and link in 15 minutes. Each case guesses wrong five times,
// then tries the right password from the same client (refused, 429) and
// from a different one (let in, 303), and a fresh code keeps the cases apart.
func TestClientIPPasswordLimits(t *testing.T) {
	f := newFixture(t)
	lim := startLimiterProcess(t)
	const target = "https://example.com/client-ip"
	// A random /48 per run, so two runs within the window do not meet.
	var b [2]byte
	_, _ = rand.Read(b[:])
	v6 := fmt.Sprintf("2001:db8:%x", uint16(b[0])<<8|uint16(b[1]))

	for name, tc := range map[string]struct {
		env map[string]string
		// guesser is the X-Forwarded-For of the i-th wrong guess; same and
		// other those of the right password from the guesser's client and
		// from another client.
		guesser     func(i int) string
		same, other string
	}{
		// The peer (127.0.0.1) is not a trusted proxy, so its
		// X-Forwarded-For is ignored however it varies: every guess is the
		// peer's. KURZ_REDIRECT_CLIENT_IP_HEADER used to make the header
		// believed from anyone.
		"spoofed X-Forwarded-For from an untrusted peer is ignored": {
			env: map[string]string{"KURZ_REDIRECT_TRUSTED_PROXIES": "192.0.2.1",
				"KURZ_REDIRECT_CLIENT_IP_HEADER": "X-Forwarded-For"},
			guesser: func(i int) string { return "198.51.100." + strconv.Itoa(10+i) },
			same:    "198.51.100.99", other: "",
		},
		// Behind a trusted proxy, two visitors are two clients: the one
		// guessing is locked out (whatever it forges left of its address),
		// the other is not.
		"two visitors behind a trusted proxy are two clients": {
			env:     map[string]string{"KURZ_REDIRECT_TRUSTED_PROXIES": "127.0.0.1/32,::1"},
			guesser: func(i int) string { return "203.0.113." + strconv.Itoa(10+i) + ", 198.51.100.66" },
			same:    "198.51.100.66", other: "198.51.100.67",
		},
		// One /64 is one client: a guesser cannot rotate through its
		// addresses; the next /64 is someone else. (The header setting
		// reads X-Forwarded-For on today's main as well.)
		"addresses in one IPv6 /64 share a limit": {
			env: map[string]string{"KURZ_REDIRECT_TRUSTED_PROXIES": "127.0.0.1/32,::1",
				"KURZ_REDIRECT_CLIENT_IP_HEADER": "X-Forwarded-For"},
			guesser: func(i int) string { return fmt.Sprintf("%s:1::%x", v6, i+1) },
			same:    v6 + ":1:ffff:ffff:ffff:ffff", other: v6 + ":2::1",
		},
	} {
		t.Run(name, func(t *testing.T) {
			code := f.code()
			f.insertLink(code, target, features{passwordHash: testHash(t)})
			env := map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim, "KURZ_REDIRECT_PASSWORD_LIMITER_TIMEOUT": "2s"}
			maps.Copy(env, tc.env)
			r := start(t, env, hooks{})
			xff := func(v string) []string {
				if v == "" {
					return nil
				}
				return []string{"X-Forwarded-For", v}
			}
			for i := range 5 {
				_, fm := openForm(t, r.HTTP, code, xff(tc.guesser(i))...)
				if resp := submit(t, r.HTTP, code, fm.cookie, fm.token, "guess "+strconv.Itoa(i), xff(tc.guesser(i))...); resp.StatusCode != http.StatusUnauthorized {
					t.Fatalf("guess %d from %q: %d, want 401", i+1, tc.guesser(i), resp.StatusCode)
				}
			}
			_, fm := openForm(t, r.HTTP, code, xff(tc.same)...)
			resp := submit(t, r.HTTP, code, fm.cookie, fm.token, testPassword, xff(tc.same)...)
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Errorf("right password from the guessing client (X-Forwarded-For %q): %d %q, want 429",
					tc.same, resp.StatusCode, resp.Header.Get("Location"))
			} else {
				assertForm(t, "429", resp, http.StatusTooManyRequests, "Too many attempts", target)
			}
			if tc.other == "" {
				return
			}
			_, fm = openForm(t, r.HTTP, code, xff(tc.other)...)
			if resp := submit(t, r.HTTP, code, fm.cookie, fm.token, testPassword, xff(tc.other)...); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != target {
				t.Errorf("right password from another client (X-Forwarded-For %q): %d %q, want 303 to the target",
					tc.other, resp.StatusCode, resp.Header.Get("Location"))
			}
		})
	}
}

// X-Forwarded-Proto is believed from trusted proxies only: a client that
// says https over plain HTTP does not get a Secure cookie (which the
// browser would then never send back over that HTTP).
func TestForwardedProtoFromUntrustedPeerIgnored(t *testing.T) {
	f := newFixture(t)
	code := f.code()
	f.insertLink(code, "https://example.com/proto", features{passwordHash: testHash(t)})
	r := start(t, map[string]string{"KURZ_REDIRECT_TRUSTED_PROXIES": "192.0.2.1",
		"KURZ_REDIRECT_CLIENT_IP_HEADER": "X-Forwarded-For"}, hooks{})
	if _, fm := openForm(t, r.HTTP, code, "X-Forwarded-Proto", "https"); fm.cookie == nil || fm.cookie.Secure {
		t.Errorf("cookie %+v for X-Forwarded-Proto: https from an untrusted peer, want one without Secure", fm.cookie)
	}
}
