package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/services/limiter/internal/ratelimit"
	"kurz.dev/services/limiter/internal/rulestore"
	"kurz.dev/tools/loadgen"
)

// matrixAlgos are the values of the demo domain's algo descriptor, in
// report order.
var matrixAlgos = []string{"token_bucket", "fixed_window", "sliding_window_counter", "sliding_log", "leaky_bucket"}

// The targets the report states as met or missed, and the open-loop run
// that checks the latency one.
const (
	// ratioTarget is the least CheckQuota throughput, as a share of direct
	// EVALSHA's, at concurrency ratioConc.
	ratioTarget = 0.7
	ratioConc   = 64
	// latencyTarget bounds a single call's p50 (concurrency 1) as a
	// multiple of direct EVALSHA's.
	latencyTarget = 2.0
	// p99Target bounds the open-loop p99 of the token bucket over the
	// spread keys at half its highest closed-loop rate.
	p99Target   = 5 * time.Millisecond
	openAlgo    = "token_bucket"
	openWorkers = 64
)

// matrixRun is a -matrix run: what to measure, and the rules the limiter
// decides with.
type matrixRun struct {
	domain string
	algos  []algoRule
	conc   []int
	spread int
	d      time.Duration
}

// algoRule is one value of the algo descriptor and the rule it selects.
type algoRule struct {
	name string
	rule *ratelimit.Rule
}

// cell is one closed-loop pair of the matrix.
type cell struct {
	algo, shape    string
	c              int
	evalsha, quota *loadgen.Result
}

// ratio compares the limiter's exact answers with EVALSHA: those decided on
// Redis and those from its over-limit cache (a denial Redis gave, until
// its retry-after); decisions it made by a rule's failure mode (its Redis
// deadline passed, or a breaker was open) are not the rule and do not
// count.
func (c cell) ratio() float64 {
	return c.quota.Rate() * (c.share(fromRedis) + c.share(fromCache)) / c.evalsha.Rate()
}

// Where the limiter's answers came from, by their tags (checkQuotaCall):
// Redis's are tagged plainly allowed or denied, the others
// "<source>/<verdict>".
const (
	fromRedis = ""
	fromCache = "over_limit_cache"
)

// share is the share of the limiter's answers from source.
func (c cell) share(source string) float64 {
	if c.quota.N == 0 {
		return 0
	}
	n := 0
	for tag, k := range c.quota.Tags {
		src, _, found := strings.Cut(tag, "/")
		if !found {
			src = fromRedis
		}
		if src == source {
			n += k
		}
	}
	return float64(n) / float64(c.quota.N)
}

// keyShape is the set of requests a measurement draws from, uniformly.
type keyShape struct {
	name string // "hot" or "spread"
	desc string
	reqs []*ratelimitv1.CheckQuotaRequest
}

// newMatrixRun checks the -matrix flags and finds each algorithm's rule in
// the rules file (empty: the built-in bootstrap file).
func newMatrixRun(domain, algos, conc, rulesFile string, spread int, d time.Duration) (*matrixRun, error) {
	if spread < 1 || d <= 0 {
		return nil, errors.New("-matrix needs -spread >= 1 and a positive -d")
	}
	m := &matrixRun{domain: domain, spread: spread, d: d}
	for s := range strings.SplitSeq(conc, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || c < 1 {
			return nil, fmt.Errorf("-conc %q: want positive integers, comma-separated", conc)
		}
		m.conc = append(m.conc, c)
	}
	cfg, err := rulestore.ReadFile(rulesFile)
	if err != nil {
		return nil, err
	}
	rules, err := ratelimit.Compile(cfg)
	if err != nil {
		return nil, err
	}
	for s := range strings.SplitSeq(algos, ",") {
		name := strings.TrimSpace(s)
		if name == "" {
			return nil, fmt.Errorf("-algos %q: want algorithm names, comma-separated", algos)
		}
		// Matched as the limiter matches a request, so the baseline decides
		// the rule the limiter would.
		_, applied := rules.Match(domain, map[string]string{"user": "u", "algo": name})
		if len(applied) != 1 {
			return nil, fmt.Errorf("-algos: algo=%q selects %d rules of domain %q, want 1", name, len(applied), domain)
		}
		m.algos = append(m.algos, algoRule{name, applied[0].Rule})
	}
	return m, nil
}

// run measures the matrix, then the open loop, and writes the report to out.
func (m *matrixRun) run(ctx context.Context, conns []*grpc.ClientConn, out io.Writer) error {
	rdb, err := connectRedis(ctx)
	if err != nil {
		return err
	}
	defer rdb.Close()
	clients := make([]ratelimitv1.RateLimitServiceClient, len(conns))
	for i, c := range conns {
		clients[i] = ratelimitv1.NewRateLimitServiceClient(c)
	}
	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	users := make([]string, m.spread)
	for i := range users {
		users[i] = "q-" + runID + "-" + strconv.Itoa(i)
	}
	start := time.Now()
	fmt.Fprintf(out, "run %s: EVALSHA = the decision script called directly on Redis Cluster; CheckQuota = through the limiter, gRPC over %d connections; %v each\n", runID, len(conns), m.d)

	var cells []cell
	for _, a := range m.algos {
		evalsha := ratelimit.Baseline(rdb, a.rule)
		if err := m.check(ctx, clients, evalsha, a, "q-"+runID+"-check"); err != nil {
			return err
		}
		shapes := []keyShape{
			{"hot", "one hot key", m.requests(a.name, []string{"q-" + runID + "-hot-" + a.name})},
			{"spread", fmt.Sprintf("%d keys, uniform", len(users)), m.requests(a.name, users)},
		}
		for _, s := range shapes {
			fmt.Fprintf(out, "== %s/%s, %s\n", m.domain, a.name, s.desc)
			for _, c := range m.conc {
				x := cell{algo: a.name, shape: s.name, c: c}
				x.evalsha = loadgen.Closed(fmt.Sprintf("EVALSHA c=%d", c), c, m.d, evalshaCall(ctx, evalsha, s.reqs))
				x.evalsha.Print(out)
				x.quota = loadgen.Closed(fmt.Sprintf("CheckQuota c=%d", c), c, m.d, checkQuotaCall(ctx, clients, s.reqs))
				x.quota.Print(out)
				fmt.Fprintf(out, "ratio: %s %s c=%d: CheckQuota exact answers = %.2f x EVALSHA (%.0f%% of answers from Redis, %.0f%% from its over-limit cache)\n",
					x.algo, x.shape, c, x.ratio(), 100*x.share(fromRedis), 100*x.share(fromCache))
				cells = append(cells, x)
			}
		}
	}

	var openRate float64
	for _, x := range cells {
		if x.algo == openAlgo && x.shape == "spread" {
			openRate = max(openRate, x.quota.Rate()/2)
		}
	}
	if openRate == 0 {
		fmt.Fprintf(out, "open loop: not measured (no %s CheckQuota rate over the spread keys)\n", openAlgo)
	} else {
		fmt.Fprintf(out, "== %s/%s, %d keys, uniform: open loop, %d workers\n", m.domain, openAlgo, len(users), openWorkers)
		open := loadgen.Open(fmt.Sprintf("CheckQuota @%.0f/s", openRate), openRate, openWorkers, m.d,
			checkQuotaCall(ctx, clients, m.requests(openAlgo, users)))
		open.Print(out)
		p99 := open.Quantile(0.99)
		fmt.Fprintf(out, "open loop at half the max rate (%.0f/s): p99 %v (target <= %v: %s)\n",
			openRate, p99.Round(time.Microsecond), p99Target, loadgen.Verdict(p99 <= p99Target))
	}
	m.summary(out, cells)
	fmt.Fprintf(out, "matrix done in %v\n", time.Since(start).Round(time.Second))
	return nil
}

// connectRedis connects to the cluster the limiter uses (KURZ_REDIS_*).
func connectRedis(ctx context.Context) (*redis.ClusterClient, error) {
	var cfg redisconn.Config
	if err := config.Load(&cfg); err != nil {
		return nil, err
	}
	// No deadline per call, and socket timeouts far beyond any decision: a
	// slow script shows in the percentiles instead of being cut and retried
	// (a retried script decides twice).
	cfg.ReadTimeout = max(cfg.ReadTimeout, 10*time.Second)
	cfg.WriteTimeout = max(cfg.WriteTimeout, 10*time.Second)
	return redisconn.New(ctx, cfg)
}

// check makes sure both sides answer and decide the same rule: the
// limiter's rule for the algorithm (from PostgreSQL, possibly edited) must
// have the numbers of the file's, or the two would not do the same work.
// EVALSHA consumes one unit of user's key; ExplainQuota only looks.
func (m *matrixRun) check(ctx context.Context, clients []ratelimitv1.RateLimitServiceClient, evalsha func(context.Context, map[string]string) (bool, error), a algoRule, user string) error {
	desc := map[string]string{"user": user, "algo": a.name}
	if _, err := evalsha(ctx, desc); err != nil {
		return fmt.Errorf("redis evalsha: %w", err)
	}
	for _, c := range clients {
		resp, err := c.ExplainQuota(ctx, &ratelimitv1.ExplainQuotaRequest{Domain: m.domain, Descriptors: desc})
		if err != nil {
			return fmt.Errorf("limiter ExplainQuota %s/%s: %w", m.domain, a.name, err)
		}
		if len(resp.GetRules()) != 1 {
			return fmt.Errorf("limiter: algo=%s matches %d rules of domain %s, the rules file 1 (-rules)", a.name, len(resp.GetRules()), m.domain)
		}
		got, want := resp.GetRules()[0].GetDecision(), a.rule
		if got.GetAlgorithm() != want.Algorithm || got.GetLimit() != want.Limit || got.GetWindow().AsDuration() != want.Window {
			return fmt.Errorf("limiter: rule %s is %s %d per %v, the rules file's %s %d per %v (-rules)",
				got.GetRule(), ratelimit.AlgorithmName(got.GetAlgorithm()), got.GetLimit(), got.GetWindow().AsDuration(),
				ratelimit.AlgorithmName(want.Algorithm), want.Limit, want.Window)
		}
	}
	return nil
}

// requests builds one CheckQuota request per user, up front: the calls
// only pick one.
func (m *matrixRun) requests(algo string, users []string) []*ratelimitv1.CheckQuotaRequest {
	reqs := make([]*ratelimitv1.CheckQuotaRequest, len(users))
	for i, u := range users {
		reqs[i] = &ratelimitv1.CheckQuotaRequest{Domain: m.domain, Descriptors: map[string]string{"user": u, "algo": algo}}
	}
	return reqs
}

func evalshaCall(ctx context.Context, evalsha func(context.Context, map[string]string) (bool, error), reqs []*ratelimitv1.CheckQuotaRequest) loadgen.Call {
	return func(int) (string, error) {
		allowed, err := evalsha(ctx, reqs[rand.IntN(len(reqs))].GetDescriptors())
		if err != nil {
			return "", err
		}
		return verdict(allowed), nil
	}
}

func checkQuotaCall(ctx context.Context, clients []ratelimitv1.RateLimitServiceClient, reqs []*ratelimitv1.CheckQuotaRequest) loadgen.Call {
	return func(w int) (string, error) {
		resp, err := clients[w%len(clients)].CheckQuota(ctx, reqs[rand.IntN(len(reqs))])
		if err != nil {
			return "", err
		}
		if resp.GetSource() == ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
			return verdict(resp.GetAllowed()), nil
		}
		// From the over-limit cache, or a failure mode decided (Redis slow
		// or away): not the baseline's work, so it is counted apart.
		return strings.ToLower(strings.TrimPrefix(resp.GetSource().String(), "DECISION_SOURCE_")) + "/" + verdict(resp.GetAllowed()), nil
	}
}

func verdict(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

// summary writes the matrix as a markdown table, then the throughput target
// per algorithm and key shape.
func (m *matrixRun) summary(out io.Writer, cells []cell) {
	fmt.Fprintf(out, "\n| %-22s | %-7s | %3s | %9s | %12s | %10s | %10s | %5s | %11s | %14s | %6s |\n",
		"algorithm", "keys", "c", "EVALSHA/s", "CheckQuota/s", "from Redis", "from cache", "ratio", "p99 EVALSHA", "p99 CheckQuota", "errors")
	fmt.Fprintln(out, "|------------------------|---------|----:|----------:|-------------:|-----------:|-----------:|------:|------------:|---------------:|-------:|")
	for _, x := range cells {
		keys := "1"
		if x.shape == "spread" {
			keys = strconv.Itoa(m.spread)
		}
		fmt.Fprintf(out, "| %-22s | %-7s | %3d | %9.0f | %12.0f | %9.0f%% | %9.0f%% | %5.2f | %11v | %14v | %6d |\n",
			x.algo, keys, x.c, x.evalsha.Rate(), x.quota.Rate(), 100*x.share(fromRedis), 100*x.share(fromCache), x.ratio(),
			x.evalsha.Quantile(0.99).Round(time.Microsecond), x.quota.Quantile(0.99).Round(time.Microsecond),
			x.evalsha.Errors+x.quota.Errors)
	}
	fmt.Fprintln(out, "\nkeys 1: one hot key, over its limit after 100 calls; the limiter answers most of its denials from its over-limit cache (\"from cache\": memory, no script run), EVALSHA runs the script every time.")
	fmt.Fprintln(out, "ratio: CheckQuota's exact answers (from Redis or its over-limit cache) per second over EVALSHA's; answers by a rule's failure mode (the limiter's Redis deadline, 10 ms by default, passed or a breaker was open) do not count.")
	for _, x := range cells {
		if x.c == 1 {
			r := float64(x.quota.Quantile(0.5)) / float64(x.evalsha.Quantile(0.5))
			fmt.Fprintf(out, "target single call (c=1) p50 <= %.1f x EVALSHA's: %s %s %.2f x (%v against %v), %s\n",
				latencyTarget, x.algo, x.shape, r, x.quota.Quantile(0.5).Round(time.Microsecond), x.evalsha.Quantile(0.5).Round(time.Microsecond),
				loadgen.Verdict(x.quota.Errors == 0 && x.evalsha.Errors == 0 && r <= latencyTarget))
		}
	}
	if !slices.Contains(m.conc, ratioConc) {
		fmt.Fprintf(out, "target throughput >= %.1f x baseline at concurrency %d: not measured (-conc)\n", ratioTarget, ratioConc)
		return
	}
	for _, x := range cells {
		if x.c == ratioConc {
			fmt.Fprintf(out, "target throughput >= %.1f x baseline at concurrency %d: %s %s %.2f x, %s\n",
				ratioTarget, ratioConc, x.algo, x.shape, x.ratio(), loadgen.Verdict(x.ratio() >= ratioTarget))
		}
	}
}
