package httpapi

import (
	"slices"
	"strings"
	"testing"
	"time"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/quota"
)

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
			d := tc.d
			d.Window = tc.window
			policy, state, ok := rateLimitFields("api", d)
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

// Path and query values must be UTF-8 text without control characters;
// any other non-ASCII text passes.
func TestIsText(t *testing.T) {
	for s, want := range map[string]bool{
		"": true, "abc-123_x": true, "café": true, "bücher.example": true, "日本": true, "a b": true, "\u202eabcd": true,
		"\xff": false, "caf\xc3": false, "a\x00b": false, "a\tb": false, "a\nb": false, "a\x7fb": false, "a\u0085b": false,
	} {
		if got := isText(s); got != want {
			t.Errorf("isText(%q) = %v, want %v", s, got, want)
		}
	}
}

// checkPath sees every wildcard of every route: each {name} of the
// pattern, in order.
func TestPathWildcards(t *testing.T) {
	for pattern, want := range map[string][]string{
		"GET /v1/links":              nil,
		"GET /v1/links/{code}/stats": {"code"},
		"POST /v1/webhooks/{webhookId}/deliveries/{id}/redeliver": {"webhookId", "id"},
		"GET /files/{rest...}": {"rest"},
		"GET /{$}":             nil,
	} {
		if got := pathWildcards(pattern); !slices.Equal(got, want) {
			t.Errorf("pathWildcards(%q) = %q, want %q", pattern, got, want)
		}
	}
	for _, rt := range (&API{}).table() {
		if got, want := len(pathWildcards(rt.pattern)), strings.Count(rt.pattern, "{"); got != want {
			t.Errorf("%s: %d wildcards found, the pattern has %d", rt.pattern, got, want)
		}
	}
}
