//go:build integration

package app

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/testkit/servertest"
)

// TestMetricFamilies: after an allowed and a denied CheckQuota, the
// limiter's /metrics has the families the dashboard (deploy/grafana) and the
// alerts read: decisions by domain, rule, outcome and source, Redis
// latency, and otelgrpc's server call duration.
func TestMetricFamilies(t *testing.T) {
	r, rl := startFile(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	desc := map[string]string{"v": unique(t)}
	for i, wantAllowed := range []bool{true, false} { // rule "one": 1 per hour
		resp, err := rl.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: "crafted", Descriptors: desc})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetAllowed() != wantAllowed {
			t.Fatalf("request %d: allowed=%v, want %v", i+1, resp.GetAllowed(), wantAllowed)
		}
	}
	// The server records a call's duration when the call ends, which can
	// be after its client has the answer: read /metrics until it is there
	// (the checks below say what is missing if it never is).
	var body string
	servertest.EventuallyState(5*time.Second, func() (bool, string) {
		code, b := r.Get(t, "/metrics")
		if code != http.StatusOK {
			t.Fatalf("/metrics: %d", code)
		}
		body = b
		return servertest.HasSeries(b, "rpc_server_call_duration_seconds_count", "CheckQuota"), ""
	})
	for _, w := range []struct {
		name string
		with []string
	}{
		{"kurz_ratelimit_decisions_total", []string{`domain="crafted"`, `rule="one"`, `source="redis"`}},
		{"kurz_ratelimit_redis_duration_seconds_bucket", []string{`error="false"`}},
		{"kurz_ratelimit_redis_duration_seconds_count", nil},
		{"rpc_server_call_duration_seconds_count", []string{"CheckQuota"}},
		{"kurz_ratelimit_fleet_replicas", []string{`fleet="` + fleetName(t) + `"`}},
	} {
		if !servertest.HasSeries(body, w.name, w.with...) {
			t.Errorf("/metrics has no %s series with %v", w.name, w.with)
		}
	}
	// Allowed and denied are told apart: two outcomes for the one rule.
	outcomes := map[string]bool{}
	for line := range strings.Lines(body) {
		if strings.HasPrefix(line, "kurz_ratelimit_decisions_total{") && strings.Contains(line, `rule="one"`) && strings.Contains(line, `domain="crafted"`) {
			if i := strings.Index(line, `outcome="`); i >= 0 {
				rest := line[i+len(`outcome="`):]
				outcomes[rest[:strings.IndexByte(rest, '"')]] = true
			}
		}
	}
	if len(outcomes) < 2 {
		t.Errorf("decisions of rule one by outcome: %v, want an allowed and a denied outcome", outcomes)
	}
}

// TestDependencyUpOnTheRealStack: the limiter's readiness check of the real
// Redis Cluster shows on /metrics as kurz_dependency_up{check="redis"} 1,
// the series the KurzRedisUnreachable alert reads.
func TestDependencyUpOnTheRealStack(t *testing.T) {
	r, _ := startFile(t)
	ok, last := servertest.EventuallyState(10*time.Second, func() (bool, string) {
		_, body := r.Get(t, "/metrics")
		for line := range strings.Lines(body) {
			if strings.HasPrefix(line, "kurz_dependency_up{") && strings.Contains(line, `check="redis"`) {
				return strings.HasSuffix(strings.TrimSpace(line), " 1"), line
			}
		}
		return false, "no kurz_dependency_up series for redis"
	})
	if !ok {
		t.Fatalf("want kurz_dependency_up{check=\"redis\"} 1 on /metrics; last: %s", last)
	}
}
