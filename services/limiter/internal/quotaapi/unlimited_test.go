package quotaapi

import (
	"context"
	"log/slog"
	"math"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/types/known/durationpb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/clientip"
	"kurz.dev/services/limiter/internal/ratelimit"
	"kurz.dev/services/limiter/internal/rulestore"
)

// A descriptor an unlimited rule decides is reported as
// envoyproxy/ratelimit reports an unlimited one (service/ratelimit.go):
// OK, no current limit, LimitRemaining the most a uint32 holds; and with
// nothing else limiting, no rate-limit headers. The engine decides it
// without Redis, which is not even there.
func TestShouldRateLimitReportsAnUnlimitedDescriptorAsEnvoyproxyRatelimit(t *testing.T) {
	cfg, err := rulestore.FromEnvoy([]rulestore.EnvoyFile{{Name: "edge.yaml", Data: []byte(`
domain: edge
descriptors:
  - {key: user, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: user, value: vip, rate_limit: {unlimited: true}}
`)}})
	if err != nil {
		t.Fatal(err)
	}
	rules, err := ratelimit.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: 50 * time.Millisecond,
	})
	t.Cleanup(func() { _ = rdb.Close() })
	e, err := ratelimit.NewEngine(rdb, rules, ratelimit.Options{Timeout: 50 * time.Millisecond}, slog.New(slog.DiscardHandler), noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	resp, err := NewEnvoy(e, HeadersBoth, clientip.Keying{}).ShouldRateLimit(context.Background(), envoyRequest("edge", "user", "vip"))
	if err != nil {
		t.Fatal(err)
	}
	st := resp.GetStatuses()[0]
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetCode() != rlsv3.RateLimitResponse_OK ||
		st.GetCurrentLimit() != nil || st.GetLimitRemaining() != math.MaxUint32 || st.GetDurationUntilReset() != nil {
		t.Errorf("user vip: %v; want OK, no current limit, %d remaining, no reset", resp, uint32(math.MaxUint32))
	}
	if h := resp.GetResponseHeadersToAdd(); len(h) != 0 {
		t.Errorf("user vip: headers %v, want none (no limit to tell)", h)
	}
}

// Beside a descriptor a rule limits, an unlimited one keeps its own
// status, and the limited one decides the request and its headers.
func TestShouldRateLimitLetsTheLimitedDescriptorDecideBesideAnUnlimitedOne(t *testing.T) {
	engine := newFake(t)
	unlimited := &ratelimitv1.RuleDecision{Rule: "vip", Allowed: true, Source: ratelimitv1.DecisionSource_DECISION_SOURCE_UNLIMITED,
		Window: durationpb.New(0), ResetAfter: durationpb.New(0), RetryAfter: durationpb.New(0)}
	limited := &ratelimitv1.RuleDecision{Rule: "per-path", Allowed: true, Limit: 10, Remaining: 4, Capacity: 10,
		Algorithm: ratelimitv1.Algorithm_ALGORITHM_FIXED_WINDOW, Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS,
		Window: durationpb.New(time.Hour), ResetAfter: durationpb.New(time.Minute), RetryAfter: durationpb.New(0)}
	engine.each = &ratelimitv1.CheckQuotaResponse{Allowed: true, DecidingRule: "per-path", Limit: 10, Remaining: 4,
		ResetAfter: durationpb.New(time.Minute), RetryAfter: durationpb.New(0), Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS,
		Decisions: []*ratelimitv1.RuleDecision{unlimited, limited}}
	engine.owners = [][]int{{0}, {1}}
	req := envoyRequest("edge", "user", "vip")
	req.Descriptors = append(req.Descriptors, envoyRequest("edge", "path", "/x").Descriptors...)
	resp, err := NewEnvoy(engine, HeadersBoth, clientip.Keying{}).ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	vip, path := resp.GetStatuses()[0], resp.GetStatuses()[1]
	if vip.GetCurrentLimit() != nil || vip.GetLimitRemaining() != math.MaxUint32 {
		t.Errorf("user vip: %v, want no current limit, %d remaining", vip, uint32(math.MaxUint32))
	}
	if path.GetCurrentLimit().GetRequestsPerUnit() != 10 || path.GetLimitRemaining() != 4 {
		t.Errorf("path: %v, want 10 an hour, 4 remaining", path)
	}
	if len(resp.GetResponseHeadersToAdd()) == 0 {
		t.Error("no headers: want the limited descriptor's")
	}
}

// envoyRequest is a request of one descriptor of one entry.
func envoyRequest(domain, key, value string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{{
		Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: key, Value: value}},
	}}}
}
