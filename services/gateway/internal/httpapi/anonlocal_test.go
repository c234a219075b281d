package httpapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/grpc"

	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/quota"
)

// stalledLimiter is a limiter connection that never answers: every call
// ends with its deadline.
type stalledLimiter struct{ grpc.ClientConnInterface }

func (stalledLimiter) Invoke(ctx context.Context, _ string, _, _ any, _ ...grpc.CallOption) error {
	<-ctx.Done()
	return ctx.Err()
}

func newStalledAPI(t *testing.T, rule LocalRule) *API {
	t.Helper()
	q, err := quota.New(stalledLimiter{}, time.Millisecond, slog.New(slog.DiscardHandler), noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Options{MaxBodyBytes: 1, MaxHeaderBytes: 1, CallTimeout: 1, MaxBulkRequests: 1, AllowAnonymous: true, AnonymousLocal: rule},
		Deps{Quota: q, Log: slog.New(slog.DiscardHandler), Meter: noop.NewMeterProvider().Meter("test")})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func edgeCall(a *API, ipKey, keyID string) error {
	tenant := callmeta.AnonymousTenant
	if keyID != "" {
		tenant = "acme"
	}
	c := &call{w: httptest.NewRecorder(), r: httptest.NewRequest(http.MethodPost, "/v1/links", nil),
		st: &reqState{id: "t", ipKey: ipKey, tenant: tenant}, keyID: keyID}
	return a.edgeQuota(c, "POST /v1/links")
}

// While the limiter does not answer in time, a burst of anonymous
// requests from one address, all at once, passes only up to the local
// bucket's capacity, the rest answered 429 with a Retry-After; another
// address has its own bucket, and a caller with an API key still passes
// (its quotas fail open).
func TestAnonymousBurstHeldLocallyWhileTheLimiterDoesNotAnswer(t *testing.T) {
	a := newStalledAPI(t, LocalRule{Limit: 60, Burst: 20})
	now := time.Unix(1_000_000, 0)
	a.anonLocal.now = func() time.Time { return now }

	const burst = 100
	var (
		wg            sync.WaitGroup
		mu            sync.Mutex
		passed, other int
	)
	for range burst {
		wg.Go(func() {
			err := edgeCall(a, "192.0.2.1", "")
			mu.Lock()
			defer mu.Unlock()
			var ae *apiError
			switch {
			case err == nil:
				passed++
			case errors.As(err, &ae) && ae.status == http.StatusTooManyRequests && ae.retryAfter >= time.Second:
			default:
				other++
				t.Errorf("anonymous request, limiter stalled: %v; want passed or 429 with Retry-After", err)
			}
		})
	}
	wg.Wait()
	if passed != 20 || other != 0 {
		t.Errorf("%d concurrent anonymous requests from one address, limiter stalled: %d passed; want 20 (the local burst)", burst, passed)
	}
	if err := edgeCall(a, "198.51.100.7", ""); err != nil {
		t.Errorf("another address, limiter stalled: %v; want passed (its own bucket)", err)
	}
	if err := edgeCall(a, "192.0.2.1", "key1"); err != nil {
		t.Errorf("a caller with an API key, limiter stalled: %v; want passed (fail open)", err)
	}
	now = now.Add(time.Second) // one token at 60 a minute
	if err := edgeCall(a, "192.0.2.1", ""); err != nil {
		t.Errorf("the address a second later: %v; want passed (refilled one)", err)
	}
	if err := edgeCall(a, "192.0.2.1", ""); err == nil {
		t.Error("the address again at once: passed; want 429")
	}
}

// Requests the limiter allowed use the bucket up (without being refused
// for it), so that answered and unanswered ones together stay within it;
// an address forgotten to make room starts empty within a refill of that,
// so a flood of addresses cannot refill one.
func TestAnonLocalChargesAllowedAndStartsEmptyAfterEviction(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	l := newAnonLocal(LocalRule{Limit: 60, Burst: 3}, 2, func() time.Time { return now })
	for range 5 {
		l.charge("a")
	}
	if ok, wait := l.take("a"); ok || wait != time.Second {
		t.Errorf("after 5 allowed requests on a bucket of 3: take %v (wait %v); want refused, 1s to wait", ok, wait)
	}
	l.charge("b")
	l.charge("c") // capacity 2: a goes
	if ok, _ := l.take("a"); ok {
		t.Error("an address forgotten to make room came back with a full bucket; want empty")
	}
	now = now.Add(3 * time.Second) // a refill after the last eviction
	l.charge("d")                  // evicts again
	now = now.Add(3 * time.Second)
	if ok, _ := l.take("e"); !ok {
		t.Error("a new address a refill after the last eviction: refused; want a full bucket")
	}
}
