package quotaapi

import (
	"fmt"
	"math"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

func TestEnvoyLimit(t *testing.T) {
	tests := map[string]struct {
		limit    int64
		window   time.Duration
		wantN    uint32
		wantUnit rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		"one second":                {5, time.Second, 5, rlsv3.RateLimitResponse_RateLimit_SECOND},
		"one minute":                {60, time.Minute, 60, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		"one hour":                  {1000, time.Hour, 1000, rlsv3.RateLimitResponse_RateLimit_HOUR},
		"one day":                   {3, 24 * time.Hour, 3, rlsv3.RateLimitResponse_RateLimit_DAY},
		"10 s scales to the minute": {3, 10 * time.Second, 18, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		"2 min scales to the min":   {10, 2 * time.Minute, 5, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		"0.5 s scales to the sec":   {4, 500 * time.Millisecond, 8, rlsv3.RateLimitResponse_RateLimit_SECOND},
		"one week":                  {3, 7 * 24 * time.Hour, 3, rlsv3.RateLimitResponse_RateLimit_WEEK},
		"30 days is a month":        {9, 30 * 24 * time.Hour, 9, rlsv3.RateLimitResponse_RateLimit_MONTH},
		"365 days is a year":        {9, 365 * 24 * time.Hour, 9, rlsv3.RateLimitResponse_RateLimit_YEAR},
		"2 weeks whole in a week":   {14, 14 * 24 * time.Hour, 7, rlsv3.RateLimitResponse_RateLimit_WEEK},
		"2 min whole in the minute": {120, 2 * time.Minute, 60, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		"48 h whole in a month":     {3, 48 * time.Hour, 45, rlsv3.RateLimitResponse_RateLimit_MONTH},
		"1 per 2 min in the hour":   {1, 2 * time.Minute, 30, rlsv3.RateLimitResponse_RateLimit_HOUR},
		"90 s whole in the hour":    {5, 90 * time.Second, 200, rlsv3.RateLimitResponse_RateLimit_HOUR},
		"none whole: nearest":       {7, 11 * time.Second, 38, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		"none whole: rounded up":    {1, 47 * time.Hour, 4, rlsv3.RateLimitResponse_RateLimit_WEEK},
		"too sparse is 1 a year":    {1, 2 * 365 * 24 * time.Hour, 1, rlsv3.RateLimitResponse_RateLimit_YEAR},
		"beyond uint32 is its max":  {1 << 40, time.Second, math.MaxUint32, rlsv3.RateLimitResponse_RateLimit_SECOND},
		"scaled beyond uint32":      {1 << 40, 10 * time.Second, math.MaxUint32, rlsv3.RateLimitResponse_RateLimit_SECOND},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := envoyLimit(&ratelimitv1.RuleDecision{Rule: "r", Limit: tc.limit, Window: durationpb.New(tc.window)})
			if got.GetName() != "r" || got.GetRequestsPerUnit() != tc.wantN || got.GetUnit() != tc.wantUnit {
				t.Errorf("got %d per %v (%q), want %d per %v", got.GetRequestsPerUnit(), got.GetUnit(), got.GetName(), tc.wantN, tc.wantUnit)
			}
		})
	}
}

// The response asks Envoy for the current draft's RateLimit and
// RateLimit-Policy fields of the deciding rule (policy "domain/rule", its
// window from the rule's decision), the older trio when configured, or
// both; Retry-After on a denial in whole seconds, rounded up, at least 1.
func TestRateLimitHeaders(t *testing.T) {
	decided := func(resp *ratelimitv1.CheckQuotaResponse, window time.Duration) *ratelimitv1.CheckQuotaResponse {
		resp.DecidingRule = "per-user"
		resp.Decisions = []*ratelimitv1.RuleDecision{{Rule: "other", Window: durationpb.New(time.Hour)},
			{Rule: "per-user", Window: durationpb.New(window)}}
		return resp
	}
	allowed := decided(&ratelimitv1.CheckQuotaResponse{Allowed: true, Limit: 10, Remaining: 7, ResetAfter: durationpb.New(2500 * time.Millisecond)}, time.Minute)
	// A denial waiting would not help (never: TestNever).
	beyond := decided(&ratelimitv1.CheckQuotaResponse{Limit: 4, Remaining: 4, RetryAfter: durationpb.New(time.Minute)}, time.Minute)
	tests := map[string]struct {
		resp  *ratelimitv1.CheckQuotaResponse
		style HeaderStyle
		want  string
	}{
		"allowed": {allowed, HeadersDraft,
			`[RateLimit-Policy="rl/per-user";q=10;w=60 RateLimit="rl/per-user";r=7;t=3]`},
		"allowed, legacy": {allowed, HeadersLegacy,
			"[RateLimit-Limit=10 RateLimit-Remaining=7 RateLimit-Reset=3]"},
		"allowed, both": {allowed, HeadersBoth,
			`[RateLimit-Policy="rl/per-user";q=10;w=60 RateLimit="rl/per-user";r=7;t=3 RateLimit-Limit=10 RateLimit-Remaining=7 RateLimit-Reset=3]`},
		"negative remaining is 0": {decided(&ratelimitv1.CheckQuotaResponse{Allowed: true, Limit: 10, Remaining: -2, ResetAfter: durationpb.New(time.Second)}, time.Second), HeadersBoth,
			`[RateLimit-Policy="rl/per-user";q=10;w=1 RateLimit="rl/per-user";r=0;t=1 RateLimit-Limit=10 RateLimit-Remaining=0 RateLimit-Reset=1]`},
		"denied, retry rounded up": {decided(&ratelimitv1.CheckQuotaResponse{Limit: 4, ResetAfter: durationpb.New(time.Minute), RetryAfter: durationpb.New(1001 * time.Millisecond)}, time.Minute), HeadersDraft,
			`[RateLimit-Policy="rl/per-user";q=4;w=60 RateLimit="rl/per-user";r=0;t=60 Retry-After=2]`},
		"denied, no retry is 1 s": {decided(&ratelimitv1.CheckQuotaResponse{Limit: 4, ResetAfter: durationpb.New(0)}, time.Minute), HeadersLegacy,
			"[RateLimit-Limit=4 RateLimit-Remaining=0 RateLimit-Reset=0 Retry-After=1]"},
		"denied, more than it ever holds: no retry": {beyond, HeadersLegacy,
			"[RateLimit-Limit=4 RateLimit-Remaining=4 RateLimit-Reset=0]"},
		"denied, more than it ever holds: the rule as it stands": {beyond, HeadersDraft,
			`[RateLimit-Policy="rl/per-user";q=4;w=60 RateLimit="rl/per-user";r=4;t=0]`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var got []string
			for _, h := range rateLimitHeaders("rl", tc.resp, tc.style, tc.resp == beyond) {
				got = append(got, h.GetKey()+"="+h.GetValue())
			}
			if fmt.Sprint(got) != tc.want {
				t.Errorf("headers %v\nwant    %s", got, tc.want)
			}
		})
	}
}

func TestParseHeaderStyle(t *testing.T) {
	for _, s := range []string{"draft", "legacy", "both"} {
		if got, err := ParseHeaderStyle(s); err != nil || string(got) != s {
			t.Errorf("ParseHeaderStyle(%q) = %q, %v", s, got, err)
		}
	}
	if _, err := ParseHeaderStyle("ietf"); err == nil {
		t.Error(`ParseHeaderStyle("ietf"): no error`)
	}
}

func TestMoreRestrictive(t *testing.T) {
	allowed := func(limit, remaining int64) *ratelimitv1.RuleDecision {
		return &ratelimitv1.RuleDecision{Allowed: true, Limit: limit, Remaining: remaining}
	}
	denied := func(retry time.Duration) *ratelimitv1.RuleDecision {
		return &ratelimitv1.RuleDecision{RetryAfter: durationpb.New(retry)}
	}
	tests := map[string]struct {
		a, b *ratelimitv1.RuleDecision
		want bool
	}{
		"anything beats none":          {allowed(10, 10), nil, true},
		"a denial beats an allowance":  {denied(time.Second), allowed(10, 0), true},
		"an allowance loses to denial": {allowed(10, 0), denied(time.Second), false},
		"the longer retry decides":     {denied(2 * time.Second), denied(time.Second), true},
		"the shorter retry does not":   {denied(time.Second), denied(2 * time.Second), false},
		"less headroom decides":        {allowed(100, 10), allowed(10, 5), true},
		"more headroom does not":       {allowed(10, 5), allowed(100, 10), false},
		"equal headroom does not":      {allowed(10, 5), allowed(100, 50), false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := moreRestrictive(tc.a, tc.b); got != tc.want {
				t.Errorf("moreRestrictive = %v, want %v", got, tc.want)
			}
		})
	}
}

// A request is never allowed when any enforced rule denied a cost it can
// never hold, the deciding rule or another, at the sum of the costs of the
// descriptor sets that share its key; a shadow rule decides nothing.
func TestNever(t *testing.T) {
	denied := func(capacity int64) *ratelimitv1.RuleDecision {
		return &ratelimitv1.RuleDecision{Capacity: capacity, Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS}
	}
	shadow := denied(1)
	shadow.Source = ratelimitv1.DecisionSource_DECISION_SOURCE_SHADOW
	allowed := denied(1)
	allowed.Allowed = true
	for name, tc := range map[string]struct {
		decisions []*ratelimitv1.RuleDecision
		owners    [][]int
		costs     []int64
		want      bool
	}{
		"within every capacity":    {[]*ratelimitv1.RuleDecision{denied(100), denied(50)}, [][]int{{0}, {0}}, []int64{20}, false},
		"over another rule's":      {[]*ratelimitv1.RuleDecision{denied(100), denied(10)}, [][]int{{0}, {0}}, []int64{20}, true},
		"over it at 60 + 60":       {[]*ratelimitv1.RuleDecision{denied(100)}, [][]int{{0, 1}}, []int64{60, 60}, true},
		"within it at 60 + 30":     {[]*ratelimitv1.RuleDecision{denied(100)}, [][]int{{0, 1}}, []int64{60, 30}, false},
		"over it, its own set's":   {[]*ratelimitv1.RuleDecision{denied(100), denied(100)}, [][]int{{0}, {1}}, []int64{20, 101}, true},
		"within it at 60 alone":    {[]*ratelimitv1.RuleDecision{denied(100)}, [][]int{{0}}, []int64{60}, false},
		"shadow and allowed rules": {[]*ratelimitv1.RuleDecision{shadow, allowed, denied(100)}, [][]int{{0}, {0}, {0}}, []int64{20}, false},
	} {
		if got := never(&ratelimitv1.CheckQuotaResponse{Decisions: tc.decisions}, tc.owners, tc.costs); got != tc.want {
			t.Errorf("%s: never = %v, want %v", name, got, tc.want)
		}
	}
}
