// Package demo reproduces the design notes' figures with kurz's real parts:
// the race (GET+SET vs INCR+EXPIRE vs our Lua token bucket through the
// limiter service) and the five algorithms on the notes' boundary trace,
// through the same Lua scripts the service runs.
package demo

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/services/limiter/internal/ratelimit"
)

// Concurrency and limit of the notes' race.
const (
	raceRequests = 500
	raceLimit    = 100
)

// RaceResult is what the notes print for the race.
type RaceResult struct {
	GetSet, IncrExpire, Lua int
	// Next is the call right after the burst.
	Next *ratelimitv1.CheckQuotaResponse
	// After1s is how many of 50 calls passed one second later.
	After1s int
	// State is the token bucket's stored hash, PTTL its time to live.
	State map[string]string
	PTTL  time.Duration
	// LuaTook is how long the Lua burst took and AfterTook the 50 calls: the
	// bucket refills 10 tokens/s meanwhile, which Check allows for.
	LuaTook, AfterTook time.Duration
	// NotRedis counts the limiter's decisions that did not come from the
	// script on Redis: when Redis answers slower than the limiter's timeout
	// (a loaded 2-core machine can), the rule's local fallback decides, and
	// the race no longer shows what Redis does.
	NotRedis int
}

// Race runs 500 concurrent requests of one user against a limit of 100 three
// ways. user must be fresh. The Lua token bucket is the limiter service's
// domain "demo.race" (burst 100, 10 tokens/s), called over gRPC; its state
// is read back under keyPrefix, the limiter's KURZ_LIMITER_REDIS_KEY_PREFIX.
func Race(ctx context.Context, rdb *redis.ClusterClient, rl ratelimitv1.RateLimitServiceClient, user, keyPrefix string) (RaceResult, error) {
	var r RaceResult
	var firstErr atomic.Pointer[error]
	fail := func(err error) {
		if err != nil {
			firstErr.CompareAndSwap(nil, &err)
		}
	}
	minute := strconv.FormatInt(time.Now().Unix()/60, 10)

	// The buggy snippet of the notes, kept only to show the race: every
	// request reads a count before any of them writes it back.
	buggyKey := "demo:getset:{" + user + "}:" + minute
	r.GetSet = burst(raceRequests, func() bool {
		n, err := rdb.Get(ctx, buggyKey).Int()
		if err != nil && err != redis.Nil {
			fail(err)
			return false
		}
		if n >= raceLimit {
			return false
		}
		fail(rdb.Set(ctx, buggyKey, n+1, time.Minute).Err())
		return true
	})
	// The minimal fix: INCR is atomic. (EXPIRE as a second command can still
	// leave a key without TTL if the process dies in between: the limiter's
	// scripts set the TTL in the same script instead.)
	incrKey := "demo:incr:{" + user + "}:" + minute
	r.IncrExpire = burst(raceRequests, func() bool {
		n, err := rdb.Incr(ctx, incrKey).Result()
		if err != nil {
			fail(err)
			return false
		}
		if n == 1 {
			fail(rdb.Expire(ctx, incrKey, time.Minute).Err())
		}
		return n <= raceLimit
	})
	var notRedis atomic.Int64
	check := func() *ratelimitv1.CheckQuotaResponse {
		resp, err := rl.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: "demo.race", Descriptors: map[string]string{"user": user}})
		fail(err)
		// A denial from the over-limit cache is Redis's answer, remembered.
		if s := resp.GetSource(); err == nil && s != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS && s != ratelimitv1.DecisionSource_DECISION_SOURCE_OVER_LIMIT_CACHE {
			notRedis.Add(1)
		}
		return resp
	}
	start := time.Now()
	r.Lua = burst(raceRequests, func() bool { return check().GetAllowed() })
	r.Next = check()
	r.LuaTook = time.Since(start)
	time.Sleep(time.Second) // the notes' "after 1 s at 10 tokens/s"
	start = time.Now()
	r.After1s = burst(50, func() bool { return check().GetAllowed() })
	r.AfterTook = time.Since(start)
	r.NotRedis = int(notRedis.Load())

	key := keyPrefix + "rl:{demo.race:token_bucket:" + user + "}"
	var err error
	if r.State, err = rdb.HGetAll(ctx, key).Result(); err != nil {
		fail(err)
	}
	if r.PTTL, err = rdb.PTTL(ctx, key).Result(); err != nil {
		fail(err)
	}
	if p := firstErr.Load(); p != nil {
		return r, *p
	}
	return r, nil
}

func burst(n int, call func() bool) int {
	var allowed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			if call() {
				allowed.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	return int(allowed.Load())
}

// PrintRace writes the race in the notes' format.
func PrintRace(w io.Writer, r RaceResult) {
	fmt.Fprintf(w, "%-35s allowed %d/%d\n", "GET + SET (buggy), limit 100", r.GetSet, raceRequests)
	fmt.Fprintf(w, "%-35s allowed %d/%d\n", "INCR + EXPIRE, limit 100", r.IncrExpire, raceRequests)
	fmt.Fprintf(w, "%-35s allowed %d/%d\n", "Lua token bucket, burst 100", r.Lua, raceRequests)
	allowed := 0
	if r.Next.GetAllowed() {
		allowed = 1
	}
	fmt.Fprintf(w, "next call -> allowed=%d tokens_left=%d retry_after_ms=%d\n",
		allowed, r.Next.GetRemaining(), r.Next.GetRetryAfter().AsDuration().Milliseconds())
	fmt.Fprintf(w, "after 1 s at 10 tokens/s -> allowed %d/50\n", r.After1s)
	fmt.Fprintf(w, "state: { tokens: '%s', ts: '%s' } pttl: %d\n", r.State["tokens"], r.State["ts"], r.PTTL.Milliseconds())
}

// TraceRow is one algorithm's line of the boundary trace.
type TraceRow struct {
	Label    string
	Boundary int // allowed in seconds 59-61
	Later    int // allowed at second 90
	Note     string
}

// traceAlgorithms are the demo domain's rules, in the notes' order.
var traceAlgorithms = []struct{ algo, label, note string }{
	{"fixed_window", "fixed window", ""},
	{"sliding_log", "sliding log", ""},
	{"sliding_window_counter", "sliding window counter", ""},
	{"token_bucket", "token bucket (r=100/min, b=100)", ""},
	{"leaky_bucket", "leaky bucket (r=100/min, b=100)", "as a meter, the token bucket's mirror image: same admissions; it smooths only in queue mode, where admitted requests wait"},
}

// Trace replays the notes' trace (limit 100 per 60 s: 100 requests spread
// over second 59, 100 over second 60, 100 at second 90) through the limiter's
// own scripts on Redis, with the clock fixed at each instant by the engine's
// test-only CheckAt. user must be fresh.
func Trace(ctx context.Context, e *ratelimit.Engine, user string) []TraceRow {
	// A minute-aligned origin in the past, so windows line up as in the notes.
	base := time.UnixMilli((time.Now().UnixMilli()/60000 - 1000) * 60000)
	var rows []TraceRow
	for _, a := range traceAlgorithms {
		desc := map[string]string{"user": user + "-" + a.algo, "algo": a.algo}
		row := TraceRow{Label: a.label, Note: a.note}
		for _, sec := range []int{59, 60} {
			for i := range 100 {
				at := base.Add(time.Duration(sec)*time.Second + time.Duration(i)*10*time.Millisecond)
				if e.CheckAt(ctx, at, "demo", desc, 1).GetAllowed() {
					row.Boundary++
				}
			}
		}
		for range 100 {
			if e.CheckAt(ctx, base.Add(90*time.Second), "demo", desc, 1).GetAllowed() {
				row.Later++
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// PrintTrace writes the trace in the notes' format.
func PrintTrace(w io.Writer, rows []TraceRow) {
	for _, r := range rows {
		fmt.Fprintf(w, "%-32s allowed in 59-61s: %d | at t=90s: %d\n", r.Label, r.Boundary, r.Later)
		if r.Note != "" {
			fmt.Fprintf(w, "%-32s   (%s)\n", "", r.Note)
		}
	}
}

// Expected are the notes' figures; Check compares a run against them.
var Expected = map[string][2]int{
	"fixed window":                    {200, 0},
	"sliding log":                     {100, 0},
	"sliding window counter":          {102, 48},
	"token bucket (r=100/min, b=100)": {103, 48},
	"leaky bucket (r=100/min, b=100)": {103, 48},
}

// Check reports every race figure that differs from the notes'. GET+SET
// must let far more than the limit through (how many exactly depends on
// scheduling; the notes saw 500/500).
func Check(r RaceResult) []string {
	var bad []string
	if r.NotRedis > 0 {
		bad = append(bad, fmt.Sprintf("%d of the limiter's decisions came from its fallback, not Redis (Redis slower than KURZ_LIMITER_REDIS_TIMEOUT)", r.NotRedis))
	}
	if r.GetSet <= raceLimit {
		bad = append(bad, fmt.Sprintf("GET+SET allowed %d/500, want well over 100 (the race)", r.GetSet))
	}
	if r.IncrExpire != raceLimit {
		bad = append(bad, fmt.Sprintf("INCR+EXPIRE allowed %d/500, want 100/500", r.IncrExpire))
	}
	// The bucket refills 10 tokens/s while the burst runs: exactly 100 when
	// it takes under 100 ms (as in the notes), one more per 100 ms beyond.
	refilled := func(d time.Duration) int { return int(d / (100 * time.Millisecond)) }
	if r.Lua < raceLimit || r.Lua > raceLimit+refilled(r.LuaTook) {
		bad = append(bad, fmt.Sprintf("Lua token bucket allowed %d/500 in %v, want 100 (+1 per 100 ms)", r.Lua, r.LuaTook))
	}
	if (r.Next.GetAllowed() && refilled(r.LuaTook) == 0) || (!r.Next.GetAllowed() && r.Next.GetRetryAfter().AsDuration() <= 0) {
		bad = append(bad, fmt.Sprintf("the call after the burst: allowed=%v retry_after=%v, want denied with a positive retry-after once the burst is spent",
			r.Next.GetAllowed(), r.Next.GetRetryAfter().AsDuration()))
	}
	// One second refills 10 tokens, on top of any the slow burst left over.
	leftover := int(max(0, r.Next.GetRemaining()))
	if r.After1s < 10 || r.After1s > 11+leftover+refilled(r.AfterTook) {
		bad = append(bad, fmt.Sprintf("after 1 s: allowed %d/50 in %v, want 10", r.After1s, r.AfterTook))
	}
	// The notes' {tokens, ts}, the algorithm that wrote them (a = 4, the
	// token bucket) and the burst it wrote them under (b; see the limiter
	// README, "Algorithms").
	if len(r.State) != 4 || r.State["tokens"] == "" || r.State["ts"] == "" || r.State["a"] != "4" || r.State["b"] == "" {
		bad = append(bad, fmt.Sprintf("state %v, want exactly {a: 4, tokens, ts, b}", r.State))
	}
	if r.PTTL <= 9*time.Second || r.PTTL > 11*time.Second {
		bad = append(bad, fmt.Sprintf("PTTL %v, want about the 10 s refill + 1 s", r.PTTL))
	}
	return bad
}

// CheckTrace reports every line of the boundary trace that differs from the
// notes'.
func CheckTrace(rows []TraceRow) []string {
	var bad []string
	for _, row := range rows {
		if want := Expected[row.Label]; [2]int{row.Boundary, row.Later} != want {
			bad = append(bad, fmt.Sprintf("%s: %d | %d, want %d | %d", row.Label, row.Boundary, row.Later, want[0], want[1]))
		}
	}
	return bad
}
