//go:build integration

package quotaapi

import (
	"context"
	"fmt"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/clientip"
)

// BenchmarkCachedDenial measures a hot key's answer from the over-limit
// cache through each API's handler, in process: the limiter's own work per
// decision on a hot key, without gRPC (make bench measures it through
// gRPC beside the peers). The cache holds a denial for a second at most,
// so one call a second is decided on Redis again.
func BenchmarkCachedDenial(b *testing.B) {
	e := realEngine(b, `
domains:
  bench:
    rules:
      - {name: per-user, key: [user], algorithm: fixed_window, limit: 1, window: 1h, failure_mode: open}
`)
	user := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	b.Run("ShouldRateLimit", func(b *testing.B) {
		s := NewEnvoy(e.Engine, HeadersDraft, clientip.Keying{})
		req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{descriptor("user", user+"-envoy")}}
		for range 2 { // the second call is denied on Redis and cached
			if _, err := s.ShouldRateLimit(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		for b.Loop() {
			resp, err := s.ShouldRateLimit(context.Background(), req)
			if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
				b.Fatalf("want OVER_LIMIT, got %v, %v", resp.GetOverallCode(), err)
			}
		}
	})
	b.Run("CheckQuota", func(b *testing.B) {
		s := New(e.Engine)
		req := &ratelimitv1.CheckQuotaRequest{Domain: "bench", Descriptors: map[string]string{"user": user + "-quota"}}
		for range 2 {
			if _, err := s.CheckQuota(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		for b.Loop() {
			resp, err := s.CheckQuota(context.Background(), req)
			if err != nil || resp.GetAllowed() {
				b.Fatalf("want a denial, got allowed=%v, %v", resp.GetAllowed(), err)
			}
		}
	})
}
