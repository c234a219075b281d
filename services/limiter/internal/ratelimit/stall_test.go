//go:build integration

package ratelimit

import (
	"context"
	"sync"
	"testing"
	"time"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/testkit/redistest"
)

// stallRules: one fail-closed rule of 10 per hour per algorithm, and a
// local one.
const stallRules = `
domains:
  s:
    rules:
      - {name: token_bucket, key: [user], match: {algo: token_bucket}, algorithm: token_bucket, limit: 10, window: 1h, failure_mode: closed}
      - {name: fixed_window, key: [user], match: {algo: fixed_window}, algorithm: fixed_window, limit: 10, window: 1h, failure_mode: closed}
      - {name: sliding_window_counter, key: [user], match: {algo: sliding_window_counter}, algorithm: sliding_window_counter, limit: 10, window: 1h, failure_mode: closed}
      - {name: sliding_log, key: [user], match: {algo: sliding_log}, algorithm: sliding_log, limit: 10, window: 1h, failure_mode: closed}
      - {name: leaky_bucket, key: [user], match: {algo: leaky_bucket}, algorithm: leaky_bucket, limit: 10, window: 1h, failure_mode: closed}
      - {name: local, key: [user], match: {algo: local}, algorithm: fixed_window, limit: 10, window: 1h, failure_mode: local}
`

// A request the limiter denied while its Redis node stalled consumes
// nothing there. The scripts the deadline cut are still on the node's
// pipeline and run when it wakes; what their late replies say they
// consumed is given back. (They used to stay: ten fail-closed denials of
// a fresh key left its log full, and the key locked out for its window.)
// Fail closed for every algorithm, and a local share spent, one by one
// (Check) and batched (CheckMany).
func TestDenialsDuringAStallConsumeNothingOnRedis(t *testing.T) {
	for _, batched := range []bool{false, true} {
		name := "Check"
		if batched {
			name = "CheckMany"
		}
		t.Run(name, func(t *testing.T) {
			node := redistest.Start(t)
			// The pipeline's I/O deadline (the client's socket timeouts) is
			// long: the replies that come after the stall are read. The
			// decision timeout is what the stall must outlast, and no less
			// than a loaded machine under -race needs to send a script: a
			// call whose deadline passes before it is sent sends nothing
			// (the local share it allowed is then not on Redis), and the
			// warm-up and the looks after the stall must reach Redis
			// (at 50 ms, 3 of 15 runs beside two busy loops failed so).
			e := engine(t, privateCluster(t, node, 10*time.Second), stallRules, Options{
				Timeout: time.Second, Replicas: 2, BreakerThreshold: 1000, AutoPipeline: true,
			})
			user := unique(t)
			desc := func(algo string) map[string]string { return map[string]string{"user": user, "algo": algo} }
			const calls = 10
			// The node holds the scripts, as a node in service does (a
			// script it lacks would be answered NOSCRIPT, and not run).
			warm := map[string]string{"user": user + "-warm", "algo": "token_bucket"}
			e.Check(context.Background(), "s", warm, 1)
			e.CheckMany(context.Background(), []Request{{Domain: "s", Desc: warm, Cost: 1}})
			got := map[string][]*ratelimitv1.CheckQuotaResponse{}
			node.Pause()
			t.Cleanup(node.Resume)
			var wg sync.WaitGroup
			var mu sync.Mutex
			for _, algo := range append(algos[:len(algos):len(algos)], "local") {
				if batched {
					reqs := make([]Request, calls)
					for i := range reqs {
						reqs[i] = Request{Domain: "s", Desc: desc(algo), Cost: 1}
					}
					wg.Go(func() {
						out := e.CheckMany(context.Background(), reqs)
						mu.Lock()
						got[algo] = append(got[algo], out...)
						mu.Unlock()
					})
					continue
				}
				for range calls {
					wg.Go(func() {
						resp := e.Check(context.Background(), "s", desc(algo), 1)
						mu.Lock()
						got[algo] = append(got[algo], resp)
						mu.Unlock()
					})
				}
			}
			wg.Wait()
			node.Resume()
			e.Wait() // the late replies, and the refunds they call for

			for algo, resps := range got {
				allowed := 0
				for _, r := range resps {
					if r.Allowed {
						allowed++
					}
					want := ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED
					if algo == "local" {
						want = ratelimitv1.DecisionSource_DECISION_SOURCE_LOCAL_FALLBACK
					}
					if r.Source != want {
						t.Fatalf("%s during the stall: source %v, want %v", algo, r.Source, want)
					}
				}
				// The local fallback's share is 10 / 2 replicas; what it
				// allowed is on Redis too once the node wakes (the README's
				// "consumed twice"), what it denied is not.
				want := int64(calls)
				if algo == "local" {
					if allowed != calls/2 {
						t.Fatalf("local fallback allowed %d of %d, want %d", allowed, calls, calls/2)
					}
					want = calls - calls/2
				} else if allowed != 0 {
					t.Fatalf("%s: fail closed allowed %d", algo, allowed)
				}
				look := e.Check(context.Background(), "s", desc(algo), 0)
				if look.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
					t.Fatalf("%s after the stall: source %v, want REDIS", algo, look.Source)
				}
				if look.Remaining != want {
					t.Errorf("%s after the stall: %d remaining on Redis, want %d (denied requests consumed)", algo, look.Remaining, want)
				}
			}
		})
	}
}
