//go:build integration

package app

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

// Leased rules through three limiter processes (KURZ_LIMITER_REPLICAS=3),
// each taking leases of 10 units of one key: 1,500 concurrent CheckQuota,
// limit 100 per hour, spread round-robin. Every algorithm allows at most
// 100 (the fixed window 200 and the sliding window counter 101 if the burst
// straddles an hour boundary, their documented bounds) and at least 95,
// allowances come from leases and denials from Redis. Then each process
// takes one unit of a second key (a lease of 10 each, 9 unused) and stops on
// SIGTERM, giving its leases back: Redis has exactly 100 minus what was
// allowed left, of both keys.
func TestThreeProcessesLeaseNoMoreThanTheLimit(t *testing.T) {
	bin := buildLimiter(t)
	procs := make([]*limiterProcess, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range procs {
		grpcAddr, httpAddr := freeAddr(t), freeAddr(t)
		// A caller may wait behind a few lease takes of its key (one in
		// flight per process): the decision timeout bounds the whole wait,
		// and a loaded CI machine under the race detector must not push
		// it into the failure mode.
		wg.Go(func() {
			procs[i], errs[i] = startLimiter(t, bin, grpcAddr, httpAddr, "KURZ_LIMITER_REPLICAS=3", "KURZ_LIMITER_REDIS_TIMEOUT=5s")
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}

	algos := []string{"token_bucket", "fixed_window", "sliding_window_counter", "sliding_log", "leaky_bucket"}
	users, spare := map[string]string{}, map[string]string{}
	allowedBy := map[string]int64{}
	straddled := map[string]bool{}
	burst := map[string]time.Time{} // when each algorithm's burst began
	for _, algo := range algos {
		t.Run(algo, func(t *testing.T) {
			users[algo] = unique(t)
			req := &ratelimitv1.CheckQuotaRequest{Domain: "lease3", Descriptors: map[string]string{"user": users[algo], "algo": algo}}
			var allowed atomic.Int64
			var mu sync.Mutex
			odd := map[string]int{} // answers neither leased allowances nor Redis denials
			errs := make(chan error, 1500)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range 1500 {
				rl := procs[i%3].rl
				wg.Go(func() {
					<-start
					resp, err := rl.CheckQuota(context.Background(), req)
					if err != nil {
						errs <- err
						return
					}
					want := ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS
					if resp.GetAllowed() {
						allowed.Add(1)
						want = ratelimitv1.DecisionSource_DECISION_SOURCE_LEASE
					}
					if s := resp.GetSource(); s != want && (want != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS || s != ratelimitv1.DecisionSource_DECISION_SOURCE_OVER_LIMIT_CACHE) {
						mu.Lock()
						odd[fmt.Sprintf("allowed=%v source=%v", resp.GetAllowed(), resp.GetSource())]++
						mu.Unlock()
					}
				})
			}
			before := time.Now()
			burst[algo] = before
			close(start)
			wg.Wait()
			after := time.Now()
			close(errs)
			for err := range errs {
				t.Fatalf("CheckQuota: %v", err)
			}
			if len(odd) > 0 {
				t.Errorf("answers neither allowed from a LEASE nor denied by REDIS or its over-limit cache (a failure mode decided): %v", odd)
			}

			straddled[algo] = before.UnixMilli()/time.Hour.Milliseconds() != after.UnixMilli()/time.Hour.Milliseconds()
			most := int64(100)
			switch {
			case straddled[algo] && algo == "sliding_window_counter":
				most = 101
			case straddled[algo] && algo == "fixed_window":
				most = 200
			}
			got := allowed.Load()
			allowedBy[algo] = got
			t.Logf("allowed %d/1500", got)
			if got > most || got < 95 {
				t.Errorf("allowed %d/1500 through 3 leasing processes, want 95..%d (straddles an hour boundary: %v)", got, most, straddled[algo])
			}

			spare[algo] = unique(t) + "-spare"
			for i, p := range procs {
				resp, err := p.rl.CheckQuota(context.Background(), &ratelimitv1.CheckQuotaRequest{Domain: "lease3", Descriptors: map[string]string{"user": spare[algo], "algo": algo}})
				if err != nil {
					t.Fatal(err)
				}
				if !resp.GetAllowed() || resp.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_LEASE {
					t.Errorf("second key on process %d: allowed=%v source=%v, want allowed from a LEASE", i, resp.GetAllowed(), resp.GetSource())
				}
			}
		})
	}

	for i, p := range procs {
		if err := p.Stop(); err != nil {
			t.Errorf("process %d after SIGTERM: %v, want exit status 0\n%s", i, err, p.Output())
		}
	}
	// The leases came back at shutdown: look (cost 0, nothing leased) with
	// a limiter of this test process.
	_, rl := startFile(t)
	for _, algo := range algos {
		for user, want := range map[string]int64{users[algo]: 100 - allowedBy[algo], spare[algo]: 97} {
			resp, err := rl.ExplainQuota(context.Background(), &ratelimitv1.ExplainQuotaRequest{
				Domain: "lease3", Descriptors: map[string]string{"user": user, "algo": algo}, Cost: ptr(uint32(0)),
			})
			if err != nil {
				t.Fatal(err)
			}
			left := explanationOf(t, resp, algo).GetDecision().GetRemaining()
			// The look comes seconds after the burst, more under load.
			since := time.Since(burst[algo])
			switch algo {
			case "fixed_window", "sliding_window_counter":
				if burst[algo].UnixMilli()/time.Hour.Milliseconds() != time.Now().UnixMilli()/time.Hour.Milliseconds() {
					continue // the window ended since: a lease given back after it counts nowhere
				}
			case "token_bucket", "leaky_bucket":
				// 100 per hour refill (drain) since the burst: a unit
				// started, and one per 36 s.
				if extra := left - want; extra > 0 && extra <= 1+int64(since/(time.Hour/100)) {
					continue
				}
			}
			if left != want {
				t.Errorf("%s, user %s, %v after the burst, the processes stopped: Redis has %d left, want %d (every unused leased unit given back)", algo, user, since.Round(time.Millisecond), left, want)
			}
		}
	}
	if t.Failed() {
		for i, p := range procs {
			t.Logf("process %d output:\n%s", i, p.Output())
		}
	}
}
