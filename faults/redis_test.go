//go:build integration

package faults

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
)

// The limiter's per-decision Redis timeout in these tests (production: 10 ms):
// long enough that a healthy Redis under the race detector answers within
// it, short enough that a fallback is still quick.
const redisTimeout = 100 * time.Millisecond

// answerMargin is what a CheckQuota may take beyond the Redis timeout and
// the slowest healthy answer (breaker bookkeeping, retries of a reset
// connection).
const answerMargin = 250 * time.Millisecond

// wantFallback is how each failure mode must answer when Redis cannot.
var wantFallback = map[string]struct {
	source  ratelimitv1.DecisionSource
	allowed bool
}{
	"open":   {ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_OPEN, true},
	"closed": {ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED, false},
	"local":  {ratelimitv1.DecisionSource_DECISION_SOURCE_LOCAL_FALLBACK, true},
}

var modes = []string{"open", "closed", "local"}

// limiterOn starts a limiter on the given Redis addresses with the fault
// rules.
func limiterOn(t *testing.T, redisAddrs []string, env ...string) *service {
	t.Helper()
	return startService(t, "limiter", append([]string{
		"KURZ_REDIS_ADDRS=" + strings.Join(redisAddrs, ","),
		"KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE=" + testdata(t, "rules.yaml"),
		"KURZ_LIMITER_REDIS_TIMEOUT=" + redisTimeout.String(),
	}, env...)...)
}

// decisionLoad sends CheckQuota for the fault domain from workers spread
// over the three failure modes and 300 keys per mode.
func decisionLoad(t *testing.T, limiter *service, workers int) *steadyLoad {
	rl := ratelimitv1.NewRateLimitServiceClient(limiter.conn(t))
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	return startLoad(workers, func(ctx context.Context, w, i int) sample {
		mode := modes[w%len(modes)]
		user := run + "-" + strconv.Itoa((i*workers+w)%300)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		resp, err := rl.CheckQuota(cctx, &ratelimitv1.CheckQuotaRequest{
			Domain: "fault", Descriptors: map[string]string{"mode": mode, "user": user}})
		return sample{tag: mode, err: err, outcome: resp.GetSource().String(), ok: resp.GetAllowed()}
	})
}

// checkFailureModes asserts that every sample was answered, and every
// answer not from Redis by its rule's failure mode; it returns how many
// fallbacks each mode saw. No answer may wait for Redis past its timeout:
// none takes longer than the slowest answer of the healthy phase before
// faultAt (what this machine's load costs any request) plus the Redis
// timeout and a margin.
func checkFailureModes(t *testing.T, samples []sample, faultAt time.Time) map[string]int {
	t.Helper()
	healthy := between(samples, time.Time{}, faultAt)
	if len(healthy) == 0 {
		t.Fatal("no sample before the fault")
	}
	bound := maxLatency(healthy) + redisTimeout + answerMargin
	fallbacks := map[string]int{}
	for _, s := range samples {
		if s.err != nil {
			t.Fatalf("CheckQuota (%s rule) failed instead of applying its failure mode: %v", s.tag, s.err)
		}
		if s.latency > bound {
			t.Errorf("CheckQuota (%s rule, %s) took %v: over the healthy maximum %v + the Redis timeout %v + %v",
				s.tag, s.outcome, s.latency, maxLatency(healthy), redisTimeout, answerMargin)
		}
		if byRedis(s.outcome) {
			continue
		}
		want := wantFallback[s.tag]
		if s.outcome != want.source.String() || s.ok != want.allowed {
			t.Fatalf("%s rule without Redis answered %s allowed=%v, want %s allowed=%v", s.tag, s.outcome, s.ok, want.source, want.allowed)
		}
		fallbacks[s.tag]++
	}
	return fallbacks
}

// byRedis reports whether a decision's source is Redis: its script, or a
// denial of it the over-limit cache remembers until its retry-after.
func byRedis(outcome string) bool {
	return outcome == ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS.String() ||
		outcome == ratelimitv1.DecisionSource_DECISION_SOURCE_OVER_LIMIT_CACHE.String()
}

// lastFallback is the send time of the last answer not from Redis.
func lastFallback(samples []sample) time.Time {
	var last time.Time
	for _, s := range samples {
		if !byRedis(s.outcome) {
			last = s.at
		}
	}
	return last
}

// allFromRedis reports whether the last n samples were all decided by Redis.
func allFromRedis(l *steadyLoad, n int) (bool, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.samples) < n {
		return false, "too few samples"
	}
	for _, s := range l.samples[len(l.samples)-n:] {
		if !byRedis(s.outcome) {
			return false, fmt.Sprintf("a recent %s decision from %s", s.tag, s.outcome)
		}
	}
	return true, ""
}

// enforcedAgain asserts that a fresh key of the "enforce" quota (5 per hour)
// gets exactly 5 of 8 requests, every one decided by Redis.
func enforcedAgain(t *testing.T, limiter *service) {
	t.Helper()
	rl := ratelimitv1.NewRateLimitServiceClient(limiter.conn(t))
	user := "after-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	allowed := 0
	for range 8 {
		resp, err := rl.CheckQuota(context.Background(), &ratelimitv1.CheckQuotaRequest{
			Domain: "enforce", Descriptors: map[string]string{"user": user}})
		if err != nil {
			t.Fatal(err)
		}
		if !byRedis(resp.GetSource().String()) {
			t.Fatalf("after recovery a decision came from %s", resp.GetSource())
		}
		if resp.GetAllowed() {
			allowed++
		}
	}
	if allowed != 5 {
		t.Fatalf("after recovery %d of 8 requests passed a quota of 5: the quota is not enforced", allowed)
	}
}

// A Redis master is killed with SIGKILL under steady limiter load. Every
// CheckQuota is still answered within the Redis timeout plus a margin,
// each rule by its failure mode while its slots have no master; once the
// cluster has promoted the replica, the limiter is back on Redis within a
// bound and quotas are enforced again. Redirects keep serving throughout.
func TestRedisMasterKilled(t *testing.T) {
	cluster := privateCluster(t)
	limiter := limiterOn(t, cluster.Addrs())
	redisEnv := "KURZ_REDIS_ADDRS=" + strings.Join(cluster.Addrs(), ",")
	shortener := startService(t, "shortener", redisEnv, "KURZ_LIMITER_GRPC_ADDR="+limiter.grpcAddr,
		"KURZ_SHORTENER_BASE_URL=http://short.test")
	redirect := startService(t, "redirect", redisEnv, "KURZ_LIMITER_GRPC_ADDR="+limiter.grpcAddr)
	codes := createLinks(t, shortener, 30)

	decisions := decisionLoad(t, limiter, 12)
	redirects := redirectLoad(t, redirect, codes, 2)
	if !decisions.awaitSamples(300, time.Minute) {
		t.Fatal("no steady load before the fault")
	}
	victim, err := cluster.MasterOf(context.Background(), "any")
	if err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	victim.Kill()
	if err := cluster.AwaitHealthy(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	promoted := time.Since(killedAt)
	eventually(t, 20*time.Second, "every decision from Redis again", func() (bool, string) { return allFromRedis(decisions, 300) })
	samples := decisions.stop()
	served := redirects.stop()

	logPhases(t, samples, killedAt, killedAt.Add(promoted))
	fallbacks := checkFailureModes(t, samples, killedAt)
	for _, m := range modes {
		if fallbacks[m] == 0 {
			t.Errorf("the %s rule never fell back: the fault did not reach it", m)
		}
	}
	back := lastFallback(samples).Sub(killedAt)
	checkRedirects(t, served)
	enforcedAgain(t, limiter)
	report(t, "Redis master killed (SIGKILL) under steady CheckQuota load", "every call answered by its rule's failure mode within the Redis timeout; back on Redis after the replica's promotion; quotas enforced again; redirects keep serving", fmt.Sprintf("%d decisions, %v fallbacks, p99 %v, max %v (timeout %v); replica promoted after %v; limiter back on Redis %v after the kill; %d redirects, all 302",
		len(samples), fallbacks, quantile(samples, 0.99).Round(time.Millisecond), maxLatency(samples).Round(time.Millisecond),
		redisTimeout, promoted.Round(time.Millisecond), back.Round(time.Millisecond), len(served)))
	if back > 15*time.Second {
		t.Errorf("the limiter took %v after the kill to decide from Redis again, want at most 15 s", back)
	}
}

// createLinks creates n links through the shortener and returns their codes.
func createLinks(t *testing.T, shortener *service, n int) []string {
	t.Helper()
	sc := shortenerv1.NewShortenerServiceClient(shortener.conn(t))
	ctx := callmeta.Outgoing(context.Background(), "faults", "192.0.2.1")
	codes := make([]string, n)
	for i := range codes {
		resp, err := sc.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: fmt.Sprintf("https://example.com/faults/%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		codes[i] = resp.GetLink().GetCode()
	}
	return codes
}

var noFollow = &http.Client{
	Timeout:       5 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// redirectLoad GETs the codes round-robin from workers.
func redirectLoad(t *testing.T, redirect *service, codes []string, workers int) *steadyLoad {
	return pacedRedirectLoad(t, redirect, codes, workers, 0)
}

// pacedRedirectLoad is redirectLoad with at most one redirect started per
// interval across the workers (back to back if interval is 0): clicks then
// arrive at a rate a consumer keeps up with on a loaded machine.
func pacedRedirectLoad(t *testing.T, redirect *service, codes []string, workers int, interval time.Duration) *steadyLoad {
	var tick <-chan time.Time
	if interval > 0 {
		ticker := time.NewTicker(interval)
		t.Cleanup(ticker.Stop)
		tick = ticker.C
	}
	base := "http://" + redirect.httpAddr + "/"
	return startLoad(workers, func(ctx context.Context, w, i int) sample {
		if tick != nil {
			<-tick // pacing the load, not waiting for a state
		}
		code := codes[(i*workers+w)%len(codes)]
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+code, nil)
		req.Header.Set("User-Agent", browserUA)
		resp, err := noFollow.Do(req)
		if err != nil {
			return sample{tag: code, err: err}
		}
		resp.Body.Close()
		return sample{tag: code, outcome: strconv.Itoa(resp.StatusCode) + " " + resp.Header.Get("X-Source"), ok: resp.StatusCode == http.StatusFound}
	})
}

// checkRedirects asserts every redirect was answered 302.
func checkRedirects(t *testing.T, served []sample) {
	t.Helper()
	if len(served) == 0 {
		t.Fatal("no redirect was made")
	}
	for _, s := range served {
		if s.err != nil || !s.ok {
			t.Fatalf("%v redirect of %s failed during the fault: %s, err %v", s.at.Format("15:04:05.000"), s.tag, s.outcome, s.err)
		}
	}
}

// logPhases logs latency figures before, during and after a fault, by how
// the requests were answered.
func logPhases(t *testing.T, samples []sample, faultAt, healedAt time.Time) {
	t.Helper()
	phases := []struct {
		name     string
		from, to time.Time
	}{{"before", time.Time{}, faultAt}, {"during", faultAt, healedAt}, {"after", healedAt, time.Now()}}
	for _, ph := range phases {
		by := map[string][]sample{}
		for _, s := range between(samples, ph.from, ph.to) {
			by[s.outcome] = append(by[s.outcome], s)
		}
		for outcome, ss := range by {
			t.Logf("%-6s %-32s n=%-5d p50 %-8v p99 %-8v max %v", ph.name, outcome, len(ss),
				quantile(ss, 0.5).Round(time.Millisecond), quantile(ss, 0.99).Round(time.Millisecond), maxLatency(ss).Round(time.Millisecond))
		}
	}
}

// Redis turns slow, not dead: every node answers 400 ms late, past the
// limiter's timeout. Decisions fall back within the timeout; the circuit
// breakers open, so the limiter stops paying the timeout on every call
// (Redis calls that fail are a small fraction of the decisions made
// meanwhile); when the latency goes, the limiter is back on Redis.
func TestRedisSlow(t *testing.T) {
	cluster := privateCluster(t)
	limiter := limiterOn(t, cluster.Addrs())
	decisions := decisionLoad(t, limiter, 12)
	if !decisions.awaitSamples(300, time.Minute) {
		t.Fatal("no steady load before the fault")
	}
	before := scrape(t, limiter)
	slowAt := time.Now()
	for _, n := range cluster.Nodes {
		n.Proxy.SetDelay(4 * redisTimeout)
	}
	eventually(t, 30*time.Second, "a breaker open", func() (bool, string) {
		m := scrape(t, limiter)
		open := m.sum("kurz_ratelimit_breakers_open")
		return open >= 1, fmt.Sprintf("%v open; %v", open, m.names("kurz_ratelimit"))
	})
	if !decisions.awaitSamples(300, time.Minute) {
		t.Fatal("the load stalled while Redis was slow")
	}
	during := scrape(t, limiter)
	restoredAt := time.Now()
	for _, n := range cluster.Nodes {
		n.Proxy.SetDelay(0)
	}
	eventually(t, 20*time.Second, "every decision from Redis again", func() (bool, string) { return allFromRedis(decisions, 300) })
	eventually(t, 10*time.Second, "every breaker closed", func() (bool, string) {
		open := scrape(t, limiter).sum("kurz_ratelimit_breakers_open")
		return open == 0, fmt.Sprintf("%v open", open)
	})
	samples := decisions.stop()

	logPhases(t, samples, slowAt, restoredAt)
	fallbacks := checkFailureModes(t, samples, slowAt)
	for _, m := range modes {
		if fallbacks[m] == 0 {
			t.Errorf("the %s rule never fell back: the fault did not reach it", m)
		}
	}
	failedCalls := during.sum(`kurz_ratelimit_redis_duration_seconds_count{error="true"`) - before.sum(`kurz_ratelimit_redis_duration_seconds_count{error="true"`)
	slowFallbacks := during.sum("kurz_ratelimit_fallbacks_total") - before.sum("kurz_ratelimit_fallbacks_total")
	if slowFallbacks == 0 || failedCalls > slowFallbacks/4 {
		t.Errorf("while Redis was slow %v Redis calls failed for %v fallback decisions: the breaker did not spare the timeout", failedCalls, slowFallbacks)
	}
	back := lastFallback(samples).Sub(restoredAt)
	report(t, "Redis slow: every node 400 ms late, over the limiter's 100 ms timeout", "decisions fall back within the timeout; the breaker stops paying it on every call; back on Redis when the latency goes", fmt.Sprintf("+%v per round trip, timeout %v: %d decisions, %v fallbacks; %v Redis calls paid the timeout for %v fallback decisions; back on Redis %v after the latency went",
		4*redisTimeout, redisTimeout, len(samples), fallbacks, failedCalls, slowFallbacks, max(back, 0).Round(time.Millisecond)))
	if back > 10*time.Second {
		t.Errorf("the limiter took %v after Redis recovered to decide from Redis again, want at most 10 s", back)
	}
}
