//go:build integration

package app

import (
	"context"
	"net/http"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"kurz.dev/pkg/testkit/servertest"
)

// Through Envoy's API on the real Redis Cluster, at
// KURZ_LIMITER_NEAR_LIMIT_RATIO=0.5, kurz_ratelimit_near_limit_total counts
// what envoyproxy/ratelimit's near_limit would: of per-user's 10, the 6th
// to 10th allowed request (more than 5 used), not the two it denies, nor a
// check of hits_addend 0 in between; of the shadow per-client's 4, the 3rd
// and 4th, not the requests it would have denied. The decisions counter
// beside it has every request, the check included.
func TestNearLimitCountsAllowancesOnTheRealCluster(t *testing.T) {
	r := startWith(t, map[string]string{
		"KURZ_LIMITER_RULES_SOURCE":     "file",
		"KURZ_LIMITER_RULES_FILE":       rulesFile(t),
		"KURZ_LIMITER_NEAR_LIMIT_RATIO": "0.5",
	})
	rls := rlsv3.NewRateLimitServiceClient(r.Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	user, client := unique(t)+"-user", unique(t)+"-client"
	request := func(hits *wrapperspb.UInt64Value) rlsv3.RateLimitResponse_Code {
		t.Helper()
		descriptor := func(key, value string) *ratelimitcommonv3.RateLimitDescriptor {
			return &ratelimitcommonv3.RateLimitDescriptor{
				Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}, HitsAddend: hits,
			}
		}
		resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain: "near", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{descriptor("user", user), descriptor("client", client)},
		})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return resp.GetOverallCode()
	}
	for i := 1; i <= 12; i++ {
		want := rlsv3.RateLimitResponse_OK
		if i > 10 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if got := request(nil); got != want {
			t.Fatalf("request %d: %v, want %v", i, got, want)
		}
		if i == 7 {
			// A check that charges nothing (Envoy charging later, on
			// stream done): 3 of per-user's units are left.
			if got := request(wrapperspb.UInt64(0)); got != rlsv3.RateLimitResponse_OK {
				t.Fatalf("check of hits_addend 0: %v, want OK", got)
			}
		}
	}

	code, body := r.Get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	for _, c := range []struct {
		family, rule string
		labels       []string
		want         float64
	}{
		{"kurz_ratelimit_near_limit_total", "per-user", nil, 5},
		{"kurz_ratelimit_near_limit_total", "per-client", nil, 2},
		{"kurz_ratelimit_decisions_total", "per-user", []string{`outcome="allowed"`}, 11},
		{"kurz_ratelimit_decisions_total", "per-user", []string{`outcome="denied"`}, 2},
		{"kurz_ratelimit_decisions_total", "per-client", []string{`outcome="allowed"`, `source="shadow"`}, 4},
	} {
		with := append([]string{`domain="near"`, `rule="` + c.rule + `"`}, c.labels...)
		if got, _ := servertest.SeriesSum(body, c.family, with...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.family, with, got, c.want)
		}
	}
}
