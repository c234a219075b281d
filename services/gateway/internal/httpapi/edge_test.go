package httpapi

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/quota"
)

// The client IP is the peer, unless the peer is a trusted proxy: then the
// right-most X-Forwarded-For hop that is not trusted; a forged left part
// changes nothing, a malformed hop stops the walk at the last trusted one.
func TestClientIP(t *testing.T) {
	trusted, err := ParseTrustedProxies([]string{"10.0.0.0/8", "192.0.2.7", "2001:db8:ffff::/48"})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		peer string
		xff  []string
		want string
	}{
		"untrusted peer, XFF ignored":       {"203.0.113.9:5000", []string{"198.51.100.1"}, "203.0.113.9"},
		"trusted peer, one hop":             {"10.1.2.3:5000", []string{"198.51.100.1"}, "198.51.100.1"},
		"forged left part":                  {"10.1.2.3:5000", []string{"1.1.1.1, 198.51.100.1"}, "198.51.100.1"},
		"chain of trusted proxies":          {"10.1.2.3:5000", []string{"198.51.100.1, 192.0.2.7", "10.9.9.9"}, "198.51.100.1"},
		"trusted peer, no XFF":              {"10.1.2.3:5000", nil, "10.1.2.3"},
		"all hops trusted":                  {"10.1.2.3:5000", []string{"10.0.0.1, 10.0.0.2"}, "10.0.0.1"},
		"malformed hop":                     {"10.1.2.3:5000", []string{"198.51.100.1, garbage, 10.0.0.2"}, "10.0.0.2"},
		"hop with a port":                   {"10.1.2.3:5000", []string{"198.51.100.1:4444"}, "198.51.100.1"},
		"IPv6 hop with a port":              {"10.1.2.3:5000", []string{"[2001:db8::1]:4444"}, "2001:db8::1"},
		"IPv4-mapped peer":                  {"[::ffff:10.1.2.3]:5000", []string{"198.51.100.1"}, "198.51.100.1"},
		"trusted IPv6 peer":                 {"[2001:db8:ffff::1]:5000", []string{"2001:db8::5"}, "2001:db8::5"},
		"untrusted IPv6 peer, XFF ignored":  {"[2001:db8::9]:5000", []string{"198.51.100.1"}, "2001:db8::9"},
		"IPv4-mapped hop is the IPv4 twin":  {"10.1.2.3:5000", []string{"::ffff:198.51.100.1"}, "198.51.100.1"},
		"trusted peer, empty XFF entry end": {"10.1.2.3:5000", []string{"198.51.100.1, "}, "10.1.2.3"},
	} {
		t.Run(name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.peer
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := clientIP(r, trusted); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	if _, err := ParseTrustedProxies([]string{"10.0.0.0/8", "proxy.local"}); err == nil {
		t.Error("a host name was accepted as a trusted proxy")
	}
}

// The RateLimit fields are structured fields: the policy as an sf-string
// named domain/rule, q and w (whole seconds), r and t (seconds, rounded up);
// a denial has r=0 and t at least its retry-after; nothing without a
// deciding rule.
func TestRateLimitFields(t *testing.T) {
	for name, tc := range map[string]struct {
		d             quota.Decision
		window        time.Duration
		policy, state string
	}{
		"allowed": {quota.Decision{Allowed: true, Rule: "per-api-key", Limit: 60, Remaining: 19, ResetAfter: 1100 * time.Millisecond,
			Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS}, time.Minute,
			`"api/per-api-key";q=60;w=60`, `"api/per-api-key";r=19;t=2`},
		"full": {quota.Decision{Allowed: true, Rule: "per-tenant", Limit: 300, Remaining: 300}, 90 * time.Second,
			`"api/per-tenant";q=300;w=90`, `"api/per-tenant";r=300;t=0`},
		"denied": {quota.Decision{Allowed: false, Rule: "per-api-key", Limit: 60, Remaining: 3, ResetAfter: 500 * time.Millisecond, RetryAfter: 2500 * time.Millisecond},
			time.Minute, `"api/per-api-key";q=60;w=60`, `"api/per-api-key";r=0;t=3`},
		"no window known": {quota.Decision{Allowed: true, Rule: "per-ip", Limit: 10, Remaining: 9}, 0,
			`"api/per-ip";q=10`, `"api/per-ip";r=9;t=0`},
		"degraded":    {quota.Decision{Allowed: true, Degraded: true}, 0, "", ""},
		"no rule":     {quota.Decision{Allowed: true, Source: ratelimitv1.DecisionSource_DECISION_SOURCE_NO_RULE}, 0, "", ""},
		"quoted name": {quota.Decision{Allowed: true, Rule: `we"ird\`, Limit: 1, Remaining: 1}, time.Second, `"api/we\"ird\\";q=1;w=1`, `"api/we\"ird\\";r=1;t=0`},
	} {
		t.Run(name, func(t *testing.T) {
			policy, state, ok := rateLimitFields("api", tc.d, tc.window)
			if policy != tc.policy || state != tc.state || ok != (tc.policy != "") {
				t.Errorf("got %q %q %v, want %q %q", policy, state, ok, tc.policy, tc.state)
			}
		})
	}
}

// The memory of failures is bounded (least recent failure forgotten first),
// forgets after its TTL, and a repeated failure refreshes an entry.
func TestFailMemory(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	m := newFailMemory(3, time.Minute, func() time.Time { return now })
	for _, ip := range []string{"a", "b", "c"} {
		m.add(ip)
		now = now.Add(time.Second)
	}
	m.add("a") // refreshes a: b is now the least recent
	m.add("d") // over capacity: b goes
	if _, ok := m.recent("b"); ok || m.len() != 3 {
		t.Errorf("b remembered %v, %d entries; want b forgotten, 3 entries", ok, m.len())
	}
	for _, ip := range []string{"a", "c", "d"} {
		if _, ok := m.recent(ip); !ok {
			t.Errorf("%s forgotten", ip)
		}
	}
	now = now.Add(time.Minute - time.Second) // c's failure is a minute old
	if _, ok := m.recent("c"); ok {
		t.Error("c remembered past the TTL")
	}
	if until, ok := m.recent("a"); !ok || !until.After(now) {
		t.Errorf("a: %v until %v; want remembered", ok, until)
	}
	m.setTTL(time.Hour)
	now = now.Add(30 * time.Minute)
	if _, ok := m.recent("d"); !ok {
		t.Error("d forgotten though the TTL grew to an hour")
	}
}

func TestBearer(t *testing.T) {
	for in, want := range map[string]string{
		"Bearer kurz_a_b": "kurz_a_b", "bearer  tok ": "tok", "Basic dXNlcjpw": "", "Bearer": "", "Bearer a b": "", "tok": "",
	} {
		got, ok := bearer([]string{in})
		if got != want || ok != (want != "") {
			t.Errorf("bearer(%q) = %q %v, want %q", in, got, ok, want)
		}
	}
	if _, ok := bearer([]string{"Bearer a", "Bearer b"}); ok {
		t.Error("two Authorization fields accepted")
	}
}

func TestRequestIDs(t *testing.T) {
	for id, ok := range map[string]bool{
		"abc-123": true, "0f1e2d3c-aaaa-bbbb-cccc-1234567890ab": true, "a:b/c+d=": true,
		"": false, "with space": false, "new\nline": false, strings.Repeat("x", 129): false, "ünï": false,
	} {
		if validRequestID(id) != ok {
			t.Errorf("validRequestID(%q) = %v, want %v", id, !ok, ok)
		}
	}
}

// The SVG QR code is one path of 1x1 modules merged per row, in a viewBox
// of the matrix.
func TestQRSVG(t *testing.T) {
	svg := string(qrSVG([][]bool{{true, true, false}, {false, true, false}, {true, false, true}}, 120))
	want := `<svg xmlns="http://www.w3.org/2000/svg" width="120" height="120" viewBox="0 0 3 3" shape-rendering="crispEdges">` +
		`<rect width="3" height="3" fill="#fff"/><path fill="#000" d="M0 0h2v1h-2zM1 1h1v1h-1zM0 2h1v1h-1zM2 2h1v1h-1z"/></svg>` + "\n"
	if svg != want {
		t.Errorf("got  %s\nwant %s", svg, want)
	}
}
