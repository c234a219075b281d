package ratelimit

import "testing"

// BenchmarkMatchEnvoy resolves one Envoy descriptor against a domain of
// rules of which several match it, one the most specific: the work every
// ShouldRateLimit descriptor pays before any Redis call.
func BenchmarkMatchEnvoy(b *testing.B) {
	rs := compile(b, `
domains:
  envoy:
    rules:
      - {name: per-user, key: [user], algorithm: fixed_window, limit: 5, window: 1m, failure_mode: open}
      - {name: per-user-hour, key: [user], algorithm: fixed_window, limit: 50, window: 1h, failure_mode: open}
      - {name: user-v, key: [user], match: {user: "v*"}, algorithm: fixed_window, limit: 8, window: 1m, failure_mode: open}
      - {name: user-vip, key: [user], match: {user: vip}, algorithm: fixed_window, limit: 10, window: 1m, failure_mode: open}
      - {name: per-ip, key: [ip], algorithm: fixed_window, limit: 5, window: 1m, failure_mode: open}
      - {name: api-global, key: [generic_key], match: {generic_key: api}, algorithm: fixed_window, limit: 6, window: 1m, failure_mode: open}
`)
	desc := map[string]string{"user": "vip"}
	b.ReportAllocs()
	for b.Loop() {
		if got := rs.MatchEnvoy("envoy", desc); len(got) != 1 {
			b.Fatalf("%d rules apply, want 1", len(got))
		}
	}
}
