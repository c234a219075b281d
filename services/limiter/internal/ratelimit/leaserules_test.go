package ratelimit

import (
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

func TestLeaseValidation(t *testing.T) {
	for _, tc := range []struct{ rule, want string }{
		{`{name: r, key: [u], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open, lease: {size: 0, ttl: 1s}}`, "lease: size must be at least 1"},
		{`{name: r, key: [u], algorithm: token_bucket, limit: 100, burst: 10, window: 1s, failure_mode: open, lease: {size: 11, ttl: 1s}}`, "lease: size 11 exceeds what the rule holds at once (10"},
		{`{name: r, key: [u], algorithm: fixed_window, limit: 10, window: 1s, failure_mode: open, lease: {size: 11, ttl: 1s}}`, "lease: size 11 exceeds"},
		{`{name: r, key: [u], algorithm: fixed_window, limit: 10, window: 1s, failure_mode: open, lease: {size: 1}}`, `lease: ttl "": want a duration`},
		{`{name: r, key: [u], algorithm: fixed_window, limit: 10, window: 1s, failure_mode: open, lease: {size: 1, ttl: soon}}`, `lease: ttl "soon"`},
		{`{name: r, key: [u], algorithm: fixed_window, limit: 10, window: 1s, failure_mode: open, lease: {size: 1, ttl: 0s}}`, "lease: ttl 0s: want 1ms to 1m0s"},
		{`{name: r, key: [u], algorithm: fixed_window, limit: 10, window: 1s, failure_mode: open, lease: {size: 1, ttl: 2m}}`, "lease: ttl 2m0s: want 1ms to 1m0s"},
		{`{name: r, key: [u], algorithm: fixed_window, limit: 10, window: 1s, failure_mode: open, shadow: true, lease: {size: 1, ttl: 1s}}`, "lease: not with shadow"},
		{`{name: r, key: [u], algorithm: leaky_bucket, limit: 10, window: 1s, failure_mode: open, queue: true, lease: {size: 1, ttl: 1s}}`, "lease: not with queue"},
	} {
		var cfg Config
		if err := yaml.Unmarshal([]byte("domains: {d: {rules: ["+tc.rule+"]}}"), &cfg); err != nil {
			t.Fatal(err)
		}
		_, err := Compile(cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n  got %v\n  want an error containing %q", tc.rule, err, tc.want)
		}
	}
	rs := compile(t, `domains: {d: {rules: [{name: r, key: [u], algorithm: sliding_log, limit: 10, window: 1s, failure_mode: open, lease: {size: 10, ttl: 1m}}]}}`)
	if got := rs.Rules("d")[0].Lease; got != (Lease{Size: 10, TTL: time.Minute}) {
		t.Errorf("lease %+v, want size 10, ttl 1m", got)
	}
}

func TestLeaseSourceName(t *testing.T) {
	if got := sourceName(ratelimitv1.DecisionSource_DECISION_SOURCE_LEASE); got != "lease" {
		t.Errorf("sourceName(LEASE) = %q, want lease", got)
	}
}
