//go:build integration

package app

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/testkit/servertest"
)

// limiterProcess is a limiter binary running as its own process, with a
// client.
type limiterProcess struct {
	*servertest.Process
	rl ratelimitv1.RateLimitServiceClient
}

// buildLimiter builds the limiter binary (with the race detector when the
// test runs under it) into a temporary directory.
func buildLimiter(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := servertest.BuildServices(dir, "limiter"); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "limiter")
}

// freeAddr returns a loopback address nothing listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := servertest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// startLimiter runs bin with the test rules file (and env, KEY=value, on
// top) and waits until its gRPC health reports SERVING. It is safe to call
// from several goroutines.
func startLimiter(t *testing.T, bin, grpcAddr, httpAddr string, env ...string) (*limiterProcess, error) {
	p, err := servertest.StartProcess("limiter", bin, grpcAddr, "kurz.ratelimit.v1.RateLimitService", append([]string{
		"KURZ_LIMITER_GRPC_ADDR=" + grpcAddr,
		"KURZ_LIMITER_HTTP_ADDR=" + httpAddr,
		"KURZ_LIMITER_RULES_SOURCE=file",
		"KURZ_LIMITER_RULES_FILE=" + rulesFile(t),
		"KURZ_LIMITER_FLEET=" + fleetName(t),
		// Generous timeouts: under the race detector no decision may slip
		// into a failure mode; this test is about Redis decisions.
		"KURZ_LIMITER_REDIS_TIMEOUT=1s",
		"KURZ_REDIS_READ_TIMEOUT=1s",
		"KURZ_REDIS_WRITE_TIMEOUT=1s",
		"KURZ_LOG_LEVEL=error",
	}, env...)...,
	)
	if err != nil {
		return nil, err
	}
	t.Cleanup(p.Kill)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &limiterProcess{Process: p, rl: ratelimitv1.NewRateLimitServiceClient(conn)}, nil
}

// The notes' race through three limiter processes: 500 concurrent
// CheckQuota for one key, limit 100, spread round-robin over the processes.
// Every algorithm allows exactly 100 (the sliding window counter: 100, or at
// most 101 if the burst straddles its window boundary); the next call is
// denied with a positive retry-after; every answer came from Redis. Then
// each process stops gracefully on SIGTERM.
func TestThreeProcessesAllowExactlyTheLimit(t *testing.T) {
	bin := buildLimiter(t)
	procs := make([]*limiterProcess, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range procs {
		grpcAddr, httpAddr := freeAddr(t), freeAddr(t)
		wg.Go(func() { procs[i], errs[i] = startLimiter(t, bin, grpcAddr, httpAddr) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}

	for _, algo := range []string{"token_bucket", "fixed_window", "sliding_window_counter", "sliding_log", "leaky_bucket"} {
		t.Run(algo, func(t *testing.T) {
			req := &ratelimitv1.CheckQuotaRequest{Domain: "race3", Descriptors: map[string]string{"user": unique(t), "algo": algo}}
			var allowed, notRedis atomic.Int64
			errs := make(chan error, 500)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range 500 {
				rl := procs[i%3].rl
				wg.Go(func() {
					<-start
					resp, err := rl.CheckQuota(context.Background(), req)
					if err != nil {
						errs <- err
						return
					}
					if resp.GetAllowed() {
						allowed.Add(1)
					}
					if s := resp.GetSource(); s != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS && s != ratelimitv1.DecisionSource_DECISION_SOURCE_OVER_LIMIT_CACHE {
						notRedis.Add(1)
					}
				})
			}
			before := time.Now()
			close(start)
			wg.Wait()
			after := time.Now()
			close(errs)
			for err := range errs {
				t.Fatalf("CheckQuota: %v", err)
			}
			if n := notRedis.Load(); n > 0 {
				t.Errorf("%d/500 answers not from Redis (a failure mode decided)", n)
			}

			// Fixed windows and the sliding window counter count calendar
			// hours: a burst across an hour boundary is two windows.
			straddles := before.UnixMilli()/time.Hour.Milliseconds() != after.UnixMilli()/time.Hour.Milliseconds()
			want, most := int64(100), int64(100)
			switch {
			case straddles && algo == "sliding_window_counter":
				most = 101 // its documented bound across a boundary
			case straddles && algo == "fixed_window":
				most = 200 // the fixed window's documented 2x at a boundary
			}
			if got := allowed.Load(); got != want && (got < want || got > most) {
				t.Errorf("allowed %d/500 through 3 processes, want %d (straddles an hour boundary: %v)", got, want, straddles)
			}

			for i, p := range procs {
				next, err := p.rl.CheckQuota(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				if next.GetAllowed() || next.GetRetryAfter().AsDuration() <= 0 || next.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS && next.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_OVER_LIMIT_CACHE {
					t.Errorf("next call on process %d: allowed=%v retry_after=%v source=%v, want denied, retry_after > 0, REDIS (or its over-limit cache)",
						i, next.GetAllowed(), next.GetRetryAfter().AsDuration(), next.GetSource())
				}
			}
		})
	}

	for i, p := range procs {
		if err := p.Stop(); err != nil {
			t.Errorf("process %d after SIGTERM: %v, want exit status 0\n%s", i, err, p.Output())
		}
	}
	if t.Failed() {
		for i, p := range procs {
			t.Logf("process %d output:\n%s", i, p.Output())
		}
	}
}
