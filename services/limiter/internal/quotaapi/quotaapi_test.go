package quotaapi

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/services/limiter/internal/ratelimit"
	"kurz.dev/services/limiter/internal/rulestore"
)

// testRules has one domain, "cost", with one rule per user.
const testRules = `
domains:
  cost:
    rules:
      - {name: per-user, key: [user], algorithm: token_bucket, limit: 100, window: 1h, failure_mode: open}
`

// fakeEngine decides without Redis: every check is allowed, answered with
// its cost as the remaining units (so a test can tell answers apart), and
// every call is recorded.
type fakeEngine struct {
	rules *ratelimit.Ruleset
	// each is what CheckEach answers; explainErr what Explain fails with.
	each       *ratelimitv1.CheckQuotaResponse
	owners     [][]int
	explainErr error
	// descs are the descriptor sets CheckEach was asked about, eachCosts
	// each call's costs of its sets.
	descs     []map[string]string
	eachCosts [][]int64

	mu    sync.Mutex
	calls int
	costs []int64
}

func newFake(t *testing.T) *fakeEngine {
	t.Helper()
	cfg, err := rulestore.Parse([]byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := ratelimit.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &fakeEngine{rules: rules}
}

func (f *fakeEngine) record(cost int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.costs = append(f.costs, cost)
}

func (f *fakeEngine) Rules() *ratelimit.Ruleset { return f.rules }

func (f *fakeEngine) Check(_ context.Context, _ string, _ map[string]string, cost int64) *ratelimitv1.CheckQuotaResponse {
	f.record(cost)
	return &ratelimitv1.CheckQuotaResponse{Allowed: true, Remaining: cost}
}

func (f *fakeEngine) CheckMany(ctx context.Context, reqs []ratelimit.Request) []*ratelimitv1.CheckQuotaResponse {
	out := make([]*ratelimitv1.CheckQuotaResponse, len(reqs))
	for i, r := range reqs {
		out[i] = f.Check(ctx, r.Domain, r.Desc, r.Cost)
	}
	return out
}

func (f *fakeEngine) CheckEach(_ context.Context, _ string, descs []map[string]string, costs []int64) (*ratelimitv1.CheckQuotaResponse, [][]int) {
	f.record(costs[0])
	f.mu.Lock()
	f.descs = append(f.descs, descs...)
	f.eachCosts = append(f.eachCosts, costs)
	f.mu.Unlock()
	return f.each, f.owners
}

func (f *fakeEngine) Explain(_ context.Context, _ string, _ map[string]string, cost int64) (*ratelimitv1.ExplainQuotaResponse, error) {
	f.record(cost)
	if f.explainErr != nil {
		return nil, f.explainErr
	}
	return &ratelimitv1.ExplainQuotaResponse{Allowed: true}, nil
}

// refusal returns the ErrorInfo reason and the field of err's first field
// violation, failing unless err is INVALID_ARGUMENT in kurz's domain.
func refusal(t *testing.T, err error) (reason, field string) {
	t.Helper()
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v, want InvalidArgument", err)
	}
	info, br, _ := rpcerr.Details(err)
	if info.GetDomain() != rpcerr.Domain {
		t.Errorf("ErrorInfo %v, want domain %q", info, rpcerr.Domain)
	}
	if v := br.GetFieldViolations(); len(v) > 0 {
		field = v[0].GetField()
	}
	return info.GetReason(), field
}

func ptr[T any](v T) *T { return &v }

// Bad requests are refused with a reason and the field at fault, and
// without a call to the engine: nothing reaches Redis.
func TestRefusals(t *testing.T) {
	many := map[string]string{}
	for i := range 33 {
		many[fmt.Sprintf("d%02d", i)] = "x"
	}
	tests := map[string]struct {
		domain     string
		desc       map[string]string
		cost       *uint32
		wantReason string
		wantField  string
		wantMsg    string
	}{
		"empty domain":                     {"", nil, nil, ReasonDomainRequired, "domain", "domain is required"},
		"unknown domain":                   {"nope", nil, nil, ReasonDomainUnknown, "domain", `unknown domain "nope"; configured domains: [cost]`},
		"33 descriptors":                   {"cost", many, nil, ReasonDescriptorsInvalid, "descriptors", "33 descriptors: at most 32"},
		"empty name":                       {"cost", map[string]string{"": "x"}, nil, ReasonDescriptorsInvalid, "descriptors", `descriptor name "": want 1 to 64 bytes`},
		"65-byte name, cut":                {"cost", map[string]string{strings.Repeat("n", 65): "x"}, nil, ReasonDescriptorsInvalid, "descriptors", strings.Repeat("n", 32) + `…"`},
		"65-byte name, cut at a character": {"cost", map[string]string{"a" + strings.Repeat("é", 32): "x"}, nil, ReasonDescriptorsInvalid, "descriptors", `"a` + strings.Repeat("é", 15) + `…"`},
		"1025-byte value":                  {"cost", map[string]string{"user": strings.Repeat("v", 1025)}, nil, ReasonDescriptorsInvalid, "descriptors", `descriptor "user": value of 1025 bytes, at most 1024`},
		"cost over the bound":              {"cost", nil, ptr(uint32(1_000_001)), ReasonCostInvalid, "cost", "cost 1000001: at most 1000000"},
		"cost at the max uint":             {"cost", nil, ptr(^uint32(0)), ReasonCostInvalid, "cost", "cost 4294967295: at most 1000000"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			engine := newFake(t)
			svc := New(engine)
			ctx := context.Background()
			_, checkErr := svc.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: tc.domain, Descriptors: tc.desc, Cost: tc.cost})
			_, explainErr := svc.ExplainQuota(ctx, &ratelimitv1.ExplainQuotaRequest{Domain: tc.domain, Descriptors: tc.desc, Cost: tc.cost})
			for rpc, err := range map[string]error{"CheckQuota": checkErr, "ExplainQuota": explainErr} {
				reason, field := refusal(t, err)
				if reason != tc.wantReason || field != tc.wantField || !strings.Contains(status.Convert(err).Message(), tc.wantMsg) {
					t.Errorf("%s: reason %q field %q message %q; want %q %q containing %q",
						rpc, reason, field, status.Convert(err).Message(), tc.wantReason, tc.wantField, tc.wantMsg)
				}
			}
			// Behind a valid check in a batch: the whole call is refused,
			// naming the check.
			_, err := svc.CheckQuotas(ctx, &ratelimitv1.CheckQuotasRequest{Checks: []*ratelimitv1.CheckQuotaRequest{
				{Domain: "cost"}, {Domain: tc.domain, Descriptors: tc.desc, Cost: tc.cost}}})
			reason, field := refusal(t, err)
			if msg := status.Convert(err).Message(); reason != tc.wantReason || field != "checks[1]."+tc.wantField ||
				!strings.HasPrefix(msg, "checks[1]: ") || !strings.Contains(msg, tc.wantMsg) {
				t.Errorf("CheckQuotas: reason %q field %q message %q; want %q, checks[1].%s, naming checks[1]",
					reason, field, msg, tc.wantReason, tc.wantField)
			}
			if engine.calls != 0 {
				t.Errorf("the engine was called %d times for a refused request", engine.calls)
			}
		})
	}
}

func TestCheckQuotasBounds(t *testing.T) {
	engine := newFake(t)
	svc := New(engine)
	checks := make([]*ratelimitv1.CheckQuotaRequest, maxBatch+1)
	for i := range checks {
		checks[i] = &ratelimitv1.CheckQuotaRequest{Domain: "cost"}
	}
	_, err := svc.CheckQuotas(context.Background(), &ratelimitv1.CheckQuotasRequest{Checks: checks})
	if reason, field := refusal(t, err); reason != ReasonBatchSizeInvalid || field != "checks" ||
		!strings.Contains(status.Convert(err).Message(), "1001 checks: at most 1000 per call") {
		t.Errorf("1,001 checks: reason %q field %q (%v); want %s on checks naming the bound", reason, field, err, ReasonBatchSizeInvalid)
	}
	if engine.calls != 0 {
		t.Errorf("the engine was called %d times for a refused batch", engine.calls)
	}
}

// CheckQuotas answers in the checks' order, each at its own cost (1 when
// unset), however the concurrent checks interleave.
func TestCheckQuotasAnswersInOrder(t *testing.T) {
	svc := New(newFake(t))
	checks := make([]*ratelimitv1.CheckQuotaRequest, 300)
	for i := range checks {
		checks[i] = &ratelimitv1.CheckQuotaRequest{Domain: "cost", Cost: ptr(uint32(i))}
	}
	checks[0].Cost = nil
	resp, err := svc.CheckQuotas(context.Background(), &ratelimitv1.CheckQuotasRequest{Checks: checks})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetResults()) != len(checks) {
		t.Fatalf("%d results, want %d", len(resp.GetResults()), len(checks))
	}
	for i, r := range resp.GetResults() {
		want := int64(max(i, 1))
		if r.GetRemaining() != want {
			t.Errorf("result %d answers the check of cost %d, want %d", i, r.GetRemaining(), want)
		}
	}
}

// ExplainQuota fails only when Redis does: UNAVAILABLE, retryable, saying
// nothing of the Redis error.
func TestExplainQuotaStateUnavailable(t *testing.T) {
	engine := newFake(t)
	engine.explainErr = errors.New("explain: redis: dial tcp 10.0.0.7:7001: connect: connection refused")
	_, err := New(engine).ExplainQuota(context.Background(), &ratelimitv1.ExplainQuotaRequest{Domain: "cost"})
	st := status.Convert(err)
	info, _, retryInfo := rpcerr.Details(err)
	reason, retry := info.GetReason(), retryInfo.GetRetryDelay().AsDuration()
	if st.Code() != codes.Unavailable || reason != ReasonStateUnavailable || retry != time.Second {
		t.Errorf("got %v, reason %q, retry %v; want Unavailable, %s, 1s", err, reason, retry, ReasonStateUnavailable)
	}
	if strings.Contains(st.Message(), "10.0.0.7") {
		t.Errorf("message %q names the Redis address", st.Message())
	}
}

func descriptor(k, v string) *ratelimitcommonv3.RateLimitDescriptor {
	return &ratelimitcommonv3.RateLimitDescriptor{Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
}

// Envoy requests are refused as CheckQuota refuses them, with the field
// named in Envoy's request, and without a call to the engine.
func TestEnvoyRefusals(t *testing.T) {
	var many []*ratelimitcommonv3.RateLimitDescriptor
	for range 33 {
		many = append(many, descriptor("user", "u"))
	}
	negative := descriptor("user", "u")
	negative.IsNegativeHits = true
	tests := map[string]struct {
		req        *rlsv3.RateLimitRequest
		wantReason string
		wantField  string
	}{
		"empty domain":       {&rlsv3.RateLimitRequest{Descriptors: many[:1]}, ReasonDomainRequired, "domain"},
		"unknown domain, 33": {&rlsv3.RateLimitRequest{Domain: "nope", Descriptors: many}, ReasonDescriptorsInvalid, "descriptors"},
		"no descriptors":     {&rlsv3.RateLimitRequest{Domain: "cost"}, ReasonDescriptorsInvalid, "descriptors"},
		"33 descriptors":     {&rlsv3.RateLimitRequest{Domain: "cost", Descriptors: many}, ReasonDescriptorsInvalid, "descriptors"},
		"empty entry key":    {&rlsv3.RateLimitRequest{Domain: "cost", Descriptors: append(many[:1:1], descriptor("", "u"))}, ReasonDescriptorsInvalid, "descriptors[1].entries"},
		"is_negative_hits":   {&rlsv3.RateLimitRequest{Domain: "cost", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{negative}}, ReasonCostInvalid, "descriptors[0].is_negative_hits"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			engine := newFake(t)
			_, err := NewEnvoy(engine, HeadersDraft, clientip.Keying{}).ShouldRateLimit(context.Background(), tc.req)
			if reason, field := refusal(t, err); reason != tc.wantReason || field != tc.wantField {
				t.Errorf("reason %q field %q (%v); want %q %q", reason, field, err, tc.wantReason, tc.wantField)
			}
			if engine.calls != 0 {
				t.Errorf("the engine was called %d times for a refused request", engine.calls)
			}
		})
	}
}

// What a client sets through Envoy (a padded header's value, a huge
// hits_addend) is decided, never refused: Envoy lets a request through on
// an error unless failure_mode_deny is set.
func TestEnvoyDecidesWhatAClientCanSize(t *testing.T) {
	engine := newFake(t)
	engine.each = &ratelimitv1.CheckQuotaResponse{Allowed: false}
	engine.owners = [][]int{}
	padded, other := strings.Repeat("A", 60<<10), strings.Repeat("A", 60<<10-1)+"B"
	for _, v := range []string{padded, padded, other} {
		_, err := NewEnvoy(engine, HeadersDraft, clientip.Keying{}).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
			Domain: "cost", HitsAddend: math.MaxUint32,
			Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{descriptor("ua", v), descriptor("remote_address", v)},
		})
		if err != nil {
			t.Fatalf("a %d-byte value at hits_addend %d: %v, want a decision", len(v), uint32(math.MaxUint32), err)
		}
	}
	if len(engine.descs) != 6 {
		t.Fatalf("the engine saw %d descriptor sets, want 6", len(engine.descs))
	}
	if engine.descs[0]["ua"] != padded || engine.descs[4]["ua"] != other || engine.descs[1]["remote_address"] != padded {
		t.Error("the engine did not get the values as sent (its keys hold a long value's digest)")
	}
	if fmt.Sprint(engine.costs) != fmt.Sprint([]int64{math.MaxUint32, math.MaxUint32, math.MaxUint32}) {
		t.Errorf("engine costs %v, want the hits_addend each time", engine.costs)
	}
}

// A descriptor's own hits_addend is its cost (0: a check, as in Envoy,
// where the request's 0 counts 1), whatever the request's: Envoy fills it
// from a request header (a route's hits_addend format), and an error would
// let the request through.
func TestEnvoyDescriptorsOwnHitsAreTheirCosts(t *testing.T) {
	engine := newFake(t)
	engine.each = &ratelimitv1.CheckQuotaResponse{Allowed: true}
	engine.owners = [][]int{}
	own := func(v string, hits uint64) *ratelimitcommonv3.RateLimitDescriptor {
		d := descriptor("user", v)
		d.HitsAddend = wrapperspb.UInt64(hits)
		return d
	}
	_, err := NewEnvoy(engine, HeadersDraft, clientip.Keying{}).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain: "cost", HitsAddend: 2,
		Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{own("a", 1000), descriptor("user", "b"), own("c", 0), own("d", 1<<40)},
	})
	if err != nil {
		t.Fatalf("descriptors with hits_addend of their own: %v, want a decision", err)
	}
	if got, want := fmt.Sprint(engine.eachCosts), fmt.Sprint([][]int64{{1000, 2, 0, math.MaxUint32}}); got != want {
		t.Errorf("costs %s, want %s", got, want)
	}
}

func decision(rule string, allowed bool, limit, remaining int64, window, retry time.Duration) *ratelimitv1.RuleDecision {
	return &ratelimitv1.RuleDecision{Rule: rule, Allowed: allowed, Limit: limit, Remaining: remaining,
		Window: durationpb.New(window), ResetAfter: durationpb.New(window / 2), RetryAfter: durationpb.New(retry),
		Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS}
}

// Each descriptor gets the status of the most restrictive decision it owns;
// shadow decisions decide nothing, but a descriptor that owns only shadow
// decisions reports its tightest as its limit, OK (as envoyproxy/ratelimit
// does in shadow mode); the response carries the headers of the deciding
// rule, and the request's hits_addend is the cost.
func TestEnvoyStatuses(t *testing.T) {
	engine := newFake(t)
	shadow := decision("shadow", false, 1, 0, time.Minute, time.Hour)
	shadow.Source = ratelimitv1.DecisionSource_DECISION_SOURCE_SHADOW
	shadowOnly := decision("shadow-only", false, 3, 0, time.Minute, time.Hour)
	shadowOnly.Source = ratelimitv1.DecisionSource_DECISION_SOURCE_SHADOW
	looser := decision("shadow-looser", true, 30, 20, time.Minute, 0)
	looser.Source = ratelimitv1.DecisionSource_DECISION_SOURCE_SHADOW
	engine.each = &ratelimitv1.CheckQuotaResponse{
		Allowed: false, DecidingRule: "per-ip", Limit: 4, Remaining: 0,
		ResetAfter: durationpb.New(30 * time.Second), RetryAfter: durationpb.New(1500 * time.Millisecond),
		Decisions: []*ratelimitv1.RuleDecision{
			decision("per-key", true, 10, 5, time.Hour, 0),
			decision("per-ip", false, 4, 0, time.Minute, 1500*time.Millisecond),
			decision("per-tenant", true, 100, 90, time.Hour, 0),
			shadow,
			looser,
			shadowOnly,
		},
	}
	// Descriptor 0 owns per-key and per-ip, 1 owns per-tenant and the
	// shadow rule, 2 owns nothing, 3 owns two shadow rules alone.
	engine.owners = [][]int{{0}, {0}, {1}, {1}, {3}, {3}}
	resp, err := NewEnvoy(engine, HeadersDraft, clientip.Keying{}).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain: "cost", HitsAddend: 2,
		Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{descriptor("user", "a"), descriptor("user", "b"), descriptor("user", "c"), descriptor("user", "d")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("overall %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	type want struct {
		code      rlsv3.RateLimitResponse_Code
		rule      string
		remaining uint32
	}
	wants := []want{{rlsv3.RateLimitResponse_OVER_LIMIT, "per-ip", 0}, {rlsv3.RateLimitResponse_OK, "per-tenant", 90}, {rlsv3.RateLimitResponse_OK, "", 0},
		{rlsv3.RateLimitResponse_OK, "shadow-only", 0}}
	for j, w := range wants {
		st := resp.GetStatuses()[j]
		if got := (want{st.GetCode(), st.GetCurrentLimit().GetName(), st.GetLimitRemaining()}); got != w {
			t.Errorf("descriptor %d: %+v, want %+v", j, got, w)
		}
	}
	headers := map[string]string{}
	for _, h := range resp.GetResponseHeadersToAdd() {
		headers[h.GetKey()] = h.GetValue()
	}
	wantHeaders := map[string]string{"RateLimit-Policy": `"cost/per-ip";q=4;w=60`, "RateLimit": `"cost/per-ip";r=0;t=30`, "Retry-After": "2"}
	if fmt.Sprint(headers) != fmt.Sprint(wantHeaders) {
		t.Errorf("headers %v, want %v", headers, wantHeaders)
	}
	if fmt.Sprint(engine.costs) != "[2]" {
		t.Errorf("engine costs %v, want one CheckEach at the hits_addend 2", engine.costs)
	}
}

// Envoy's remote_address entry names a client: an IPv6 address counts under
// its /64 (KURZ_LIMITER_ENVOY_IPV6_PREFIX), so a client cannot rotate
// through its prefix; IPv4 and other entries are kept as sent.
func TestEnvoyKeysRemoteAddressByPrefix(t *testing.T) {
	engine := newFake(t)
	engine.each = &ratelimitv1.CheckQuotaResponse{Allowed: true}
	engine.owners = [][]int{}
	for _, tc := range []struct {
		keying      clientip.Keying
		value, want string
	}{
		{clientip.Keying{IPv6Prefix: 64}, "2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"},
		{clientip.Keying{IPv6Prefix: 64}, "2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"},
		{clientip.Keying{IPv6Prefix: 56}, "2001:db8:1:2ff::1", "2001:db8:1:200::/56"},
		{clientip.Keying{IPv6Prefix: 128}, "2001:db8:1:2::1", "2001:db8:1:2::1"},
		{clientip.Keying{IPv6Prefix: 64}, "203.0.113.7", "203.0.113.7"},
		{clientip.Keying{IPv6Prefix: 64}, "::ffff:203.0.113.7", "203.0.113.7"},
		{clientip.Keying{IPv6Prefix: 64}, "not-an-address", "not-an-address"},
	} {
		engine.descs = nil
		_, err := NewEnvoy(engine, HeadersDraft, tc.keying).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
			Domain:      "cost",
			Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{descriptor(RemoteAddressKey, tc.value), descriptor("user", tc.value)},
		})
		if err != nil {
			t.Fatalf("%s: %v", tc.value, err)
		}
		if len(engine.descs) != 2 || engine.descs[0][RemoteAddressKey] != tc.want || engine.descs[1]["user"] != tc.value {
			t.Errorf("/%d %s: decided %v, want remote_address %s and user as sent", tc.keying.IPv6Prefix, tc.value, engine.descs, tc.want)
		}
	}
}
