//go:build integration

package app

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/testkit/servertest"
)

// An Envoy-style request with two descriptors, each matching its own rule:
// per-descriptor statuses with the rule's limit in Envoy units, what is left
// and when it resets; OVER_LIMIT overall once one descriptor is exhausted,
// with that descriptor OVER_LIMIT and the other OK; RateLimit-* headers, and
// Retry-After on OVER_LIMIT.
func TestEnvoyShouldRateLimitTwoDescriptors(t *testing.T) {
	r, rl := startFile(t)
	rls := rlsv3.NewRateLimitServiceClient(r.Conn)
	ctx := context.Background()
	ip, key := unique(t)+"-ip", unique(t)+"-key"
	request := func(hits uint32) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain: "envoy",
			Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{
				{Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: ip}}},
				{Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: key}}},
			},
			HitsAddend: hits,
		})
		if err != nil {
			t.Fatalf("ShouldRateLimit(hits_addend=%d): %v", hits, err)
		}
		if len(resp.GetStatuses()) != 2 {
			t.Fatalf("ShouldRateLimit(hits_addend=%d): %d statuses, want 2", hits, len(resp.GetStatuses()))
		}
		return resp
	}
	type wantStatus struct {
		code      rlsv3.RateLimitResponse_Code
		perUnit   uint32
		unit      rlsv3.RateLimitResponse_RateLimit_Unit
		remaining uint32
		// reset: duration_until_reset within (reset-2s, reset]; the token
		// buckets refill slowly, so a few ms of test time barely move it.
		reset time.Duration
	}
	checkStatus := func(step string, got *rlsv3.RateLimitResponse_DescriptorStatus, want wantStatus) {
		t.Helper()
		lim := got.GetCurrentLimit()
		reset := got.GetDurationUntilReset().AsDuration()
		if got.GetCode() != want.code || lim.GetRequestsPerUnit() != want.perUnit || lim.GetUnit() != want.unit ||
			got.GetLimitRemaining() != want.remaining || reset > want.reset || reset <= want.reset-2*time.Second {
			t.Errorf("%s: status %v %d/%v remaining %d reset %v; want %v %d/%v remaining %d reset ~%v",
				step, got.GetCode(), lim.GetRequestsPerUnit(), lim.GetUnit(), got.GetLimitRemaining(), reset,
				want.code, want.perUnit, want.unit, want.remaining, want.reset)
		}
	}
	checkHeaders := func(step string, resp *rlsv3.RateLimitResponse, want map[string]string) {
		t.Helper()
		got := map[string]string{}
		for _, h := range resp.GetResponseHeadersToAdd() {
			got[h.GetKey()] = h.GetValue()
		}
		if len(got) != len(want) {
			t.Errorf("%s: headers %v, want %v", step, got, want)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: header %s = %q, want %q (all: %v)", step, k, got[k], v, got)
			}
		}
	}
	const perIP = time.Minute / 4 // one token of the per-ip bucket
	const perKey = time.Hour / 10

	// hits_addend 0 counts as 1.
	resp := request(0)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first request: overall %v, want OK", resp.GetOverallCode())
	}
	checkStatus("hits 0, per-ip", resp.GetStatuses()[0], wantStatus{rlsv3.RateLimitResponse_OK, 4, rlsv3.RateLimitResponse_RateLimit_MINUTE, 3, perIP})
	checkStatus("hits 0, per-api-key", resp.GetStatuses()[1], wantStatus{rlsv3.RateLimitResponse_OK, 10, rlsv3.RateLimitResponse_RateLimit_HOUR, 9, perKey})
	// The deciding rule is the one with the least headroom: per-ip (3/4).
	checkHeaders("hits 0", resp, map[string]string{"RateLimit-Policy": `"envoy/per-ip";q=4;w=60`, "RateLimit": `"envoy/per-ip";r=3;t=15`})

	// hits_addend 3 takes the rest of the per-ip bucket.
	resp = request(3)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("second request: overall %v, want OK", resp.GetOverallCode())
	}
	checkStatus("hits 3, per-ip", resp.GetStatuses()[0], wantStatus{rlsv3.RateLimitResponse_OK, 4, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0, 4 * perIP})
	checkStatus("hits 3, per-api-key", resp.GetStatuses()[1], wantStatus{rlsv3.RateLimitResponse_OK, 10, rlsv3.RateLimitResponse_RateLimit_HOUR, 6, 4 * perKey})
	checkHeaders("hits 3", resp, map[string]string{"RateLimit-Policy": `"envoy/per-ip";q=4;w=60`, "RateLimit": `"envoy/per-ip";r=0;t=60`})

	// Now per-ip is exhausted: OVER_LIMIT overall and for per-ip, OK for the
	// api key, which keeps what it had.
	resp = request(0)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("third request: overall %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	checkStatus("exhausted, per-ip", resp.GetStatuses()[0], wantStatus{rlsv3.RateLimitResponse_OVER_LIMIT, 4, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0, 4 * perIP})
	if st := resp.GetStatuses()[1]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit().GetRequestsPerUnit() != 10 {
		t.Errorf("exhausted, per-api-key: status %v %d, want OK 10", st.GetCode(), st.GetCurrentLimit().GetRequestsPerUnit())
	}
	headers := map[string]string{}
	for _, h := range resp.GetResponseHeadersToAdd() {
		headers[h.GetKey()] = h.GetValue()
	}
	retry, err := strconv.Atoi(headers["Retry-After"])
	if err != nil || retry < 1 || retry > 15 {
		t.Errorf("OVER_LIMIT: Retry-After %q, want 1..15 s (one per-ip token at 4/min)", headers["Retry-After"])
	}
	if headers["RateLimit-Policy"] != `"envoy/per-ip";q=4;w=60` || !strings.HasPrefix(headers["RateLimit"], `"envoy/per-ip";r=0;t=`) {
		t.Errorf("OVER_LIMIT: headers %v, want per-ip's policy (q=4;w=60) and r=0", headers)
	}

	// The denied request consumed nothing from the api key (6 left before
	// it), once the refund from the other hash slot has landed; the key
	// alone still passes.
	var left int64
	if !servertest.Eventually(2*time.Second, func() bool {
		e, err := rl.ExplainQuota(ctx, &ratelimitv1.ExplainQuotaRequest{Domain: "envoy", Descriptors: map[string]string{"api_key": key}, Cost: ptr(uint32(0))})
		if err != nil {
			t.Fatalf("ExplainQuota: %v", err)
		}
		left = explanationOf(t, e, "per-api-key").GetDecision().GetRemaining()
		return left == 6
	}) {
		t.Errorf("per-api-key after the OVER_LIMIT request: %d left, want 6 within 2 s (nothing consumed)", left)
	}
	got, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain:      "envoy",
		Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{{Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: key}}}},
	})
	if err != nil || got.GetOverallCode() != rlsv3.RateLimitResponse_OK || got.GetStatuses()[0].GetLimitRemaining() != 5 {
		t.Errorf("api key alone: %v %v, want OK with 5 remaining", got, err)
	}
}

// Envoy requests are validated like CheckQuota.
func TestEnvoyShouldRateLimitValidation(t *testing.T) {
	r, _ := startFile(t)
	rls := rlsv3.NewRateLimitServiceClient(r.Conn)
	entry := func(k, v string) *ratelimitcommonv3.RateLimitDescriptor {
		return &ratelimitcommonv3.RateLimitDescriptor{Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
	}
	var many []*ratelimitcommonv3.RateLimitDescriptor
	for i := range 33 {
		many = append(many, entry("api_key", strconv.Itoa(i)))
	}
	tests := map[string]*rlsv3.RateLimitRequest{
		"33 descriptors":  {Domain: "envoy", Descriptors: many},
		"empty domain":    {Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{entry("api_key", "k")}},
		"no descriptors":  {Domain: "envoy"},
		"empty entry key": {Domain: "envoy", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{entry("", "k")}},
	}
	for name, req := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := rls.ShouldRateLimit(context.Background(), req)
			if got := status.Code(err); got != codes.InvalidArgument {
				t.Errorf("code %v (%v), want InvalidArgument", got, err)
			}
		})
	}
}

// What a client can size through Envoy is decided, never refused (Envoy
// lets a request through on an error unless failure_mode_deny is set): a
// padded value counts under its digest, each distinct value on its own, and
// a hits_addend beyond the rule's capacity is OVER_LIMIT, nothing consumed.
func TestEnvoyDecidesWhatAClientCanSize(t *testing.T) {
	r, _ := startFile(t)
	rls := rlsv3.NewRateLimitServiceClient(r.Conn)
	ctx := context.Background()
	check := func(hits uint32, entries ...string) *rlsv3.RateLimitResponse {
		t.Helper()
		d := &ratelimitcommonv3.RateLimitDescriptor{}
		for i := 0; i < len(entries); i += 2 {
			d.Entries = append(d.Entries, &ratelimitcommonv3.RateLimitDescriptor_Entry{Key: entries[i], Value: entries[i+1]})
		}
		resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "envoy", HitsAddend: hits, Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatalf("ShouldRateLimit of a %d-byte value at hits_addend %d: %v, want a decision", len(entries[len(entries)-1]), hits, err)
		}
		return resp
	}
	padded := fmt.Sprintf("pad-%d-", time.Now().UnixNano()) + strings.Repeat("A", 32<<10)
	other := padded[:len(padded)-1] + "B"
	for i := range 10 { // per-api-key: 10 an hour
		if resp := check(0, "api_key", padded); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("padded value, call %d: %v, want OK", i+1, resp.GetOverallCode())
		}
	}
	if resp := check(0, "api_key", padded); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("padded value, call 11: %v, want OVER_LIMIT (the 10 counted)", resp.GetOverallCode())
	}
	if resp := check(0, "api_key", other); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 9 {
		t.Errorf("another padded value: %v, want OK with 9 left (counted apart)", resp)
	}

	key := fmt.Sprintf("hits-%d", time.Now().UnixNano())
	resp := check(math.MaxUint32, "api_key", key)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("hits_addend 2^32-1: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == "Retry-After" {
			t.Errorf("hits_addend beyond the capacity answered Retry-After %s: waiting would not help", h.GetValue())
		}
	}
	if resp := check(0, "api_key", key); resp.GetStatuses()[0].GetLimitRemaining() != 9 {
		t.Errorf("after the refused 2^32-1: %v, want 9 left (nothing consumed)", resp.GetStatuses()[0])
	}
}

// A domain without rules limits nothing, as in envoyproxy/ratelimit: every
// descriptor is OK (an Envoy with failure_mode_deny would otherwise refuse
// all traffic while a reload drops the domain).
func TestEnvoyUnknownDomainLimitsNothing(t *testing.T) {
	r, _ := startFile(t)
	rls := rlsv3.NewRateLimitServiceClient(r.Conn)
	entry := func(k, v string) *ratelimitcommonv3.RateLimitDescriptor {
		return &ratelimitcommonv3.RateLimitDescriptor{Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
	}
	resp, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain: "no-such-domain", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{entry("api_key", "k"), entry("remote_address", "192.0.2.1")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 2 || len(resp.GetResponseHeadersToAdd()) != 0 {
		t.Fatalf("overall %v, statuses %v, headers %v: want OK, two statuses, no headers", resp.GetOverallCode(), resp.GetStatuses(), resp.GetResponseHeadersToAdd())
	}
	for i, st := range resp.GetStatuses() {
		if st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit() != nil {
			t.Errorf("status %d: %v, want OK without a limit", i, st)
		}
	}
}

// A descriptor sent twice counts twice, as in envoyproxy/ratelimit: the key
// is decided once in the script, at double the cost.
func TestEnvoyRepeatedDescriptorCountsEachTime(t *testing.T) {
	r, _ := startFile(t)
	rls := rlsv3.NewRateLimitServiceClient(r.Conn)
	ip := unique(t)
	same := &ratelimitcommonv3.RateLimitDescriptor{Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: ip}}}
	var codes []rlsv3.RateLimitResponse_Code
	for range 3 {
		resp, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
			Domain: "envoy", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{same, same},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetStatuses()) != 2 || resp.GetStatuses()[0].GetCode() != resp.GetStatuses()[1].GetCode() {
			t.Fatalf("statuses %v: want two identical ones", resp.GetStatuses())
		}
		codes = append(codes, resp.GetOverallCode())
	}
	// per-ip allows 4: two requests of weight 2, then over the limit.
	want := []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}
	if fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Errorf("overall codes %v, want %v", codes, want)
	}
}
