// Command peerload measures kurz's limiter beside its peers, on the same
// machine, with the same rule (100 requests per minute per user) and the
// same load:
//
//   - envoyproxy/ratelimit (-envoy): fixed window on kurz's Redis Cluster,
//     Envoy's API (ShouldRateLimit), its config domain -envoy-domain;
//   - kurz through the same API (-kurz): the demo domain's fixed window;
//   - gubernator (-gubernator): one node, in memory, its default token
//     bucket (limit 100, duration 60,000 ms) through GetRateLimits;
//   - kurz through CheckQuota (-kurz): the demo domain's token bucket;
//   - kurz through gubernator's API (-kurz-gubernator, off unless given):
//     the same GetRateLimits calls as gubernator's, decided as ad-hoc
//     token buckets on Redis by a limiter with KURZ_LIMITER_GUBERNATOR=true
//     (the one -kurz-pid and -kurz-metrics name).
//
// Each target runs closed loop (-c callers over -conns gRPC connections of
// its own, -d per measurement) over one hot key (over its limit after 100
// calls) and over -spread keys drawn uniformly, fresh keys every time; the
// targets take turns, -rounds times. Each measurement charges its target's
// server process (-envoy-pid, ...) and the Redis Cluster's servers
// (-redis-pids) the CPU time they used meanwhile (/proc); kurz's answers
// are split by how they were decided (its kurz_ratelimit_decisions_total,
// read from -kurz-metrics before and after). Before measuring, every target
// must allow a fresh user 100 calls and deny the 101st.
//
// The report, markdown tables and ratios of kurz to each peer, goes to
// stdout; each run's line to stderr. An empty address skips its target.
// deploy/bench/peers.sh starts the peers and runs this:
//
//	go run ./tools/peerload -envoy 127.0.0.1:9301 -envoy-pid 123 \
//		-gubernator 127.0.0.1:9304 -gubernator-pid 124 -kurz-pid 99 -redis-pids 1,2,3,4,5,6 -d 3s -rounds 1
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	commonrlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/tools/loadgen"
)

// The rule every target enforces: 100 calls per minute per user.
const (
	ruleLimit  = 100
	ruleWindow = time.Minute
	// kurz's demo domain has a rule per algorithm, chosen by the algo
	// descriptor; these are limit 100 per 60 s keyed by user.
	kurzDomain      = "demo"
	kurzFixedWindow = "fixed_window"
	kurzTokenBucket = "token_bucket"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "peerload:", err)
		os.Exit(1)
	}
}

func run() error {
	envoyAddr := flag.String("envoy", "", "envoyproxy/ratelimit gRPC address; empty = skip")
	envoyPID := flag.Int("envoy-pid", 0, "envoyproxy/ratelimit process ID (0 = no CPU figures)")
	envoyDomain := flag.String("envoy-domain", "kurz-peers", "envoyproxy/ratelimit config domain with the rule on descriptor key user")
	gubAddr := flag.String("gubernator", "", "gubernator gRPC address; empty = skip")
	gubPID := flag.Int("gubernator-pid", 0, "gubernator process ID (0 = no CPU figures)")
	kurzAddr := flag.String("kurz", "127.0.0.1:9091", "kurz limiter gRPC address; empty = skip")
	kurzPID := flag.Int("kurz-pid", 0, "kurz limiter process ID (0 = no CPU figures)")
	kurzGubAddr := flag.String("kurz-gubernator", "", "gRPC address of a kurz limiter serving gubernator's API (KURZ_LIMITER_GUBERNATOR=true); empty = skip")
	kurzMetrics := flag.String("kurz-metrics", "http://127.0.0.1:9191/metrics", "kurz limiter metrics URL (decisions by source); empty = none")
	redisPIDs := flag.String("redis-pids", "", "process IDs of the Redis Cluster's servers, comma-separated (empty = no Redis CPU)")
	concurrency := flag.Int("c", 32, "concurrent callers")
	duration := flag.Duration("d", 10*time.Second, "duration of each measurement")
	rounds := flag.Int("rounds", 2, "times every target is measured, in turns")
	spread := flag.Int("spread", 100_000, "distinct keys of the spread key shape")
	conns := flag.Int("conns", 4, "gRPC connections per target, callers spread over them")
	shapesFlag := flag.String("shapes", "hot,spread", "key shapes to measure, comma-separated: hot, spread (one alone, to profile it)")
	flag.Parse()
	if *concurrency < 1 || *duration <= 0 || *rounds < 1 || *spread < 1 || *conns < 1 {
		return errors.New("-c, -d, -rounds, -spread and -conns must be positive")
	}
	redis, err := loadgen.ParsePIDs(*redisPIDs)
	if err != nil {
		return err
	}
	shapes, err := parseShapes(*shapesFlag)
	if err != nil {
		return err
	}

	ctx := context.Background()
	var targets []*target
	dial := func(addr string) ([]*grpc.ClientConn, error) {
		cs := make([]*grpc.ClientConn, *conns)
		for i := range cs {
			c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return nil, err
			}
			cs[i] = c
		}
		return cs, nil
	}
	if *envoyAddr != "" {
		cs, err := dial(*envoyAddr)
		if err != nil {
			return err
		}
		targets = append(targets, &target{
			name: "envoyproxy/ratelimit", api: "ShouldRateLimit", algo: "fixed window", pid: *envoyPID, redis: true,
			decided: "Redis; over-limit keys from its local cache",
			decide:  shouldRateLimit(cs, *envoyDomain, nil),
		})
	}
	if *kurzAddr != "" {
		cs, err := dial(*kurzAddr)
		if err != nil {
			return err
		}
		targets = append(targets, &target{
			name: "kurz", api: "ShouldRateLimit", algo: "fixed window", pid: *kurzPID, redis: true,
			decide:  shouldRateLimit(cs, kurzDomain, map[string]string{"algo": kurzFixedWindow}),
			sources: kurzSources(*kurzMetrics, kurzFixedWindow),
			peer:    "envoyproxy/ratelimit",
		})
	}
	if *gubAddr != "" {
		cs, err := dial(*gubAddr)
		if err != nil {
			return err
		}
		targets = append(targets, &target{
			name: "gubernator", api: "GetRateLimits", algo: "token bucket", pid: *gubPID,
			decide: gubernatorDecide(cs),
		})
	}
	if *kurzAddr != "" {
		cs, err := dial(*kurzAddr)
		if err != nil {
			return err
		}
		targets = append(targets, &target{
			name: "kurz", api: "CheckQuota", algo: "token bucket", pid: *kurzPID, redis: true,
			decide:  checkQuota(cs, kurzTokenBucket),
			sources: kurzSources(*kurzMetrics, kurzTokenBucket),
			peer:    "gubernator",
		})
	}
	if *kurzGubAddr != "" {
		cs, err := dial(*kurzGubAddr)
		if err != nil {
			return err
		}
		targets = append(targets, &target{
			name: "kurz", api: "GetRateLimits", algo: "token bucket", pid: *kurzPID, redis: true,
			decide:     gubernatorDecide(cs),
			sources:    kurzGubernatorSources(*kurzMetrics),
			peer:       "gubernator",
			untargeted: true,
		})
	}
	if len(targets) == 0 {
		return errors.New("no target: set -envoy, -gubernator, -kurz or -kurz-gubernator")
	}

	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	for i, t := range targets {
		if err := check(ctx, t, fmt.Sprintf("peers-%s-%d", runID, i)); err != nil {
			return err
		}
	}
	var ms []*measurement
	for i, t := range targets {
		for _, shape := range shapes {
			ms = append(ms, &measurement{t: t, shape: shape, keyPrefix: fmt.Sprintf("peers-%s-%d-%s", runID, i, shape)})
		}
	}
	for r := range *rounds {
		for _, m := range ms {
			if err := m.run(ctx, r, *concurrency, *duration, *spread, redis); err != nil {
				return err
			}
		}
	}
	report(os.Stdout, ms, *concurrency, *conns, *duration, *rounds, *spread, len(redis))
	return nil
}

// parseShapes reads -shapes: hot and spread, each at most once, in the
// order given.
func parseShapes(s string) ([]string, error) {
	var shapes []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f != "hot" && f != "spread" {
			return nil, fmt.Errorf("-shapes: %q is not a key shape (hot, spread)", f)
		}
		if slices.Contains(shapes, f) {
			return nil, fmt.Errorf("-shapes: %q given twice", f)
		}
		shapes = append(shapes, f)
	}
	return shapes, nil
}

// target is one system under load.
type target struct {
	name, api, algo string
	pid             int    // server process, 0 = unknown
	redis           bool   // decides on the Redis Cluster
	decided         string // how it decides, without sources (default: Redis or memory)
	// decide makes one call for caller w and says whether user was allowed.
	decide func(ctx context.Context, w int, user string) (bool, error)
	// sources, if set, returns the decisions made so far by source.
	sources func(ctx context.Context) (map[string]int64, error)
	// peer names the target this one is compared with (kurz's only).
	peer string
	// untargeted: compared with its peer in the tables, but issue #15's
	// targets were set for kurz's own APIs, not for this one.
	untargeted bool
}

func (t *target) label() string { return t.name + " " + t.api + ", " + t.algo }

// shouldRateLimit calls Envoy's API with one descriptor: user, and extra's
// entries.
func shouldRateLimit(conns []*grpc.ClientConn, domain string, extra map[string]string) func(context.Context, int, string) (bool, error) {
	clients := make([]rlsv3.RateLimitServiceClient, len(conns))
	for i, c := range conns {
		clients[i] = rlsv3.NewRateLimitServiceClient(c)
	}
	keys := slices.Sorted(maps.Keys(extra))
	return func(ctx context.Context, w int, user string) (bool, error) {
		entries := []*commonrlv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}
		for _, k := range keys {
			entries = append(entries, &commonrlv3.RateLimitDescriptor_Entry{Key: k, Value: extra[k]})
		}
		resp, err := clients[w%len(clients)].ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
			Domain:      domain,
			Descriptors: []*commonrlv3.RateLimitDescriptor{{Entries: entries}},
		})
		if err != nil {
			return false, err
		}
		return resp.GetOverallCode() == rlsv3.RateLimitResponse_OK, nil
	}
}

// checkQuota calls kurz's CheckQuota in the demo domain with algorithm algo.
func checkQuota(conns []*grpc.ClientConn, algo string) func(context.Context, int, string) (bool, error) {
	clients := make([]ratelimitv1.RateLimitServiceClient, len(conns))
	for i, c := range conns {
		clients[i] = ratelimitv1.NewRateLimitServiceClient(c)
	}
	return func(ctx context.Context, w int, user string) (bool, error) {
		resp, err := clients[w%len(clients)].CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{
			Domain:      kurzDomain,
			Descriptors: map[string]string{"user": user, "algo": algo},
		})
		return resp.GetAllowed(), err
	}
}

// kurzSources reads the limiter's decisions of the demo domain's rule by
// source from its metrics; nil without a URL.
func kurzSources(url, rule string) func(context.Context) (map[string]int64, error) {
	if url == "" {
		return nil
	}
	return func(ctx context.Context) (map[string]int64, error) {
		return decisionsBySource(ctx, url, kurzDomain, rule)
	}
}

// kurzGubernatorSources reads the decisions of kurz's gubernator API by
// source: its token buckets, counted under domain gubernator.
func kurzGubernatorSources(url string) func(context.Context) (map[string]int64, error) {
	if url == "" {
		return nil
	}
	return func(ctx context.Context) (map[string]int64, error) {
		return decisionsBySource(ctx, url, "gubernator", "token_bucket")
	}
}

// gubernatorDecide decides for caller w with one GetRateLimits call of the
// rule, gubernator's default token bucket: gubernator's and kurz's API
// alike.
func gubernatorDecide(cs []*grpc.ClientConn) func(ctx context.Context, w int, user string) (bool, error) {
	return func(ctx context.Context, w int, user string) (bool, error) {
		r, err := gubernatorCheck(ctx, cs[w%len(cs)], gubernatorReq{
			name: "per_user", key: user, hits: 1, limit: ruleLimit, durationMs: ruleWindow.Milliseconds(),
		})
		return !r.overLimit, err
	}
}

// check makes sure t enforces the rule: a fresh user gets ruleLimit
// allowances, then a denial. A window boundary within the calls lets a
// fixed window allow more, so it tries three users.
func check(ctx context.Context, t *target, prefix string) error {
	var last error
	for try := range 3 {
		user := prefix + "-check-" + strconv.Itoa(try)
		allowed := 0
		for range ruleLimit + 1 {
			ok, err := t.decide(ctx, 0, user)
			if err != nil {
				return fmt.Errorf("%s: %w", t.label(), err)
			}
			if !ok {
				break
			}
			allowed++
		}
		if allowed == ruleLimit {
			return nil
		}
		last = fmt.Errorf("%s: a fresh user got %d allowances before the first denial, want %d (is the rule configured?)", t.label(), allowed, ruleLimit)
	}
	return last
}

// measurement is one target and key shape, over every round.
type measurement struct {
	t         *target
	shape     string // "hot" or "spread"
	keyPrefix string
	rounds    []*loadgen.Result
	// CPU time over the rounds: the target's server, the Redis Cluster.
	server, redis time.Duration
	// sources counts kurz's decisions by source over the rounds.
	sources map[string]int64
}

// run measures one round, with fresh keys.
func (m *measurement) run(ctx context.Context, round, c int, d time.Duration, spread int, redisPIDs []int) error {
	prefix := m.keyPrefix + "-" + strconv.Itoa(round) + "-"
	users := []string{prefix + "hot"}
	if m.shape == "spread" {
		users = make([]string, spread)
		for i := range users {
			users[i] = prefix + strconv.Itoa(i)
		}
	}
	var src0 map[string]int64
	if m.t.sources != nil {
		var err error
		if src0, err = m.t.sources(ctx); err != nil {
			return err
		}
	}
	server0, err := pidCPU(m.t.pid)
	if err != nil {
		return err
	}
	redis0, err := loadgen.CPU(redisPIDs...)
	if err != nil {
		return err
	}
	res := loadgen.Closed(fmt.Sprintf("%s, %s", m.t.label(), m.shape), c, d, func(w int) (string, error) {
		allowed, err := m.t.decide(ctx, w, users[rand.IntN(len(users))])
		if err != nil {
			return "", err
		}
		if allowed {
			return "allowed", nil
		}
		return "denied", nil
	})
	server1, err := pidCPU(m.t.pid)
	if err != nil {
		return err
	}
	redis1, err := loadgen.CPU(redisPIDs...)
	if err != nil {
		return err
	}
	m.server += server1 - server0
	m.redis += redis1 - redis0
	if m.t.sources != nil {
		src1, err := m.t.sources(ctx)
		if err != nil {
			return err
		}
		if m.sources == nil {
			m.sources = map[string]int64{}
		}
		for k, v := range src1 {
			if n := v - src0[k]; n > 0 {
				m.sources[k] += n
			}
		}
	}
	m.rounds = append(m.rounds, res)
	res.Print(os.Stderr)
	return nil
}

// pidCPU is loadgen.CPU of one process, 0 for pid 0.
func pidCPU(pid int) (time.Duration, error) {
	if pid == 0 {
		return 0, nil
	}
	return loadgen.CPU(pid)
}

func (m *measurement) result() *loadgen.Result {
	return loadgen.Merge(m.t.label()+", "+m.shape, m.rounds...)
}

// perDecision is a CPU time per decision in microseconds; NaN without a
// process or decisions.
func perDecision(cpu time.Duration, n int, known bool) float64 {
	if !known || n == 0 {
		return nan
	}
	return float64(cpu.Microseconds()) / float64(n)
}

var nan = math.NaN()

// decidedBy describes how m's answers were decided: kurz's sources in
// shares, else where the target keeps its counters.
func (m *measurement) decidedBy() string {
	if m.sources == nil {
		if m.t.decided != "" {
			return m.t.decided
		}
		if m.t.redis {
			return "Redis"
		}
		return "memory"
	}
	names := slices.Sorted(maps.Keys(m.sources))
	if len(names) == 0 {
		return "–"
	}
	// Most frequent first.
	slices.SortStableFunc(names, func(a, b string) int { return cmp.Compare(m.sources[b], m.sources[a]) })
	for i, k := range names {
		names[i] = k + " " + m.share(k)
	}
	return strings.Join(names, ", ")
}

func sum(counts map[string]int64) int64 {
	var total int64
	for _, v := range counts {
		total += v
	}
	return total
}

// share is the percentage of m's decisions with source, "–" unknown.
func (m *measurement) share(source string) string {
	total := sum(m.sources)
	if total == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(m.sources[source])/float64(total))
}

// report writes the measurements and kurz's ratios to each peer as markdown.
func report(out io.Writer, ms []*measurement, c, conns int, d time.Duration, rounds, spread, redisN int) {
	fmt.Fprintf(out, "Closed loop, %d callers over %d gRPC connections per target, %v per measurement, %d round(s), targets in turns; "+
		"rule: %d per minute per user; hot: one user, over its limit after %d calls; spread: %d users drawn uniformly; fresh users every run. "+
		"CPU per decision: user + system time (/proc) of the target's server process and of the Redis Cluster's %d redis-server processes over the target's runs, per decision. "+
		"kurz's \"decided by\": its kurz_ratelimit_decisions_total by source over the runs.\n\n",
		c, conns, d, rounds, ruleLimit, ruleLimit, spread, redisN)
	fmt.Fprintln(out, "| system | API, algorithm | keys | decisions/s | p50 | p99 | p99.9 | server CPU µs/decision | Redis CPU µs/decision | decided by | denied | errors |")
	fmt.Fprintln(out, "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
	for _, m := range ms {
		r := m.result()
		redisCPU := fmtMicros(perDecision(m.redis, r.N, redisN > 0))
		if !m.t.redis {
			redisCPU = "(" + redisCPU + ")"
		}
		fmt.Fprintf(out, "| %s | %s, %s | %s | %.0f | %v | %v | %v | %s | %s | %s | %.1f%% | %d |\n",
			m.t.name, m.t.api, m.t.algo, m.shape, r.Rate(),
			r.Quantile(0.5).Round(time.Microsecond), r.Quantile(0.99).Round(time.Microsecond), r.Quantile(0.999).Round(time.Microsecond),
			fmtMicros(perDecision(m.server, r.N, m.t.pid != 0)), redisCPU, m.decidedBy(),
			100*float64(r.Tags["denied"])/float64(max(1, r.N)), r.Errors)
	}
	fmt.Fprintln(out, "\n(Redis CPU in parentheses: gubernator does not use Redis; the cluster's background work in the same time, for scale.)")

	fmt.Fprintln(out, "\n| kurz / peer | keys | throughput | p99 | server CPU/decision | Redis CPU/decision | server + Redis CPU/decision | kurz decided on Redis | kurz from its over-limit cache |")
	fmt.Fprintln(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|")
	var vs []versus
	for _, k := range ms {
		if k.t.peer == "" {
			continue
		}
		i := slices.IndexFunc(ms, func(p *measurement) bool { return p.t.name == k.t.peer && p.shape == k.shape })
		if i < 0 {
			continue
		}
		v := compare(k, ms[i], redisN)
		if !k.t.untargeted {
			vs = append(vs, v)
		}
		fmt.Fprintf(out, "| %s %s vs %s (%s) | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			k.t.name, k.t.api, v.peer.t.name, k.t.algo, k.shape,
			fmtRatio(v.throughput), fmtRatio(v.p99), fmtRatio(v.serverCPU), fmtRatio(v.redisCPU), fmtRatio(v.totalCPU),
			k.share("redis"), k.share("over_limit_cache"))
	}
	fmt.Fprintln(out, "\nRatios above 1: kurz is faster (throughput) or costlier (latency, CPU) than the peer; \"–\" where either side had errors (their calls are in neither the rates nor the percentiles). "+
		"kurz's over-limit cache answers a key Redis denied, at the same cost, until its retry-after, from memory (envoyproxy/ratelimit's local cache of over-limit keys is on too); "+
		"kurz's answers neither decided on Redis nor from that cache came from a rule's failure mode (its Redis deadline passed, or a node's breaker was open): cheaper, and only approximately the rule.")
	targets(out, vs, spread)
}

// versus is kurz's measurement of one key shape beside its peer's, as
// ratios (NaN where either had errors).
type versus struct {
	kurz, peer                                     *measurement
	throughput, p99, serverCPU, redisCPU, totalCPU float64
}

func compare(k, p *measurement, redisN int) versus {
	v := versus{kurz: k, peer: p}
	kr, pr := k.result(), p.result()
	if kr.Errors > 0 || pr.Errors > 0 {
		v.throughput, v.p99, v.serverCPU, v.redisCPU, v.totalCPU = nan, nan, nan, nan, nan
		return v
	}
	kServer, pServer := perDecision(k.server, kr.N, k.t.pid != 0), perDecision(p.server, pr.N, p.t.pid != 0)
	kRedis, pRedis := perDecision(k.redis, kr.N, redisN > 0), perDecision(p.redis, pr.N, redisN > 0)
	pTotal := pServer
	if p.t.redis {
		pTotal += pRedis
	} else {
		pRedis = nan
	}
	v.throughput = kr.Rate() / pr.Rate()
	v.p99 = float64(kr.Quantile(0.99)) / float64(pr.Quantile(0.99))
	v.serverCPU, v.redisCPU, v.totalCPU = kServer/pServer, kRedis/pRedis, (kServer+kRedis)/pTotal
	return v
}

// targets writes issue #15's targets for the limiter, each with this
// run's figure and whether it is met.
func targets(out io.Writer, vs []versus, spread int) {
	var t loadgen.Targets
	atLeast := func(what string, v, want float64) {
		t.Add(fmt.Sprintf("%s ≥ %.1f×", what, want), fmtRatio(v), !math.IsNaN(v) && v >= want)
	}
	atMost := func(what string, v, want float64) {
		t.Add(fmt.Sprintf("%s ≤ %.1f×", what, want), fmtRatio(v), !math.IsNaN(v) && v <= want)
	}
	keys := map[string]string{"spread": fmt.Sprintf("%d keys", spread), "hot": "one hot key"}
	for _, shape := range []string{"spread", "hot"} {
		for _, v := range vs {
			if v.kurz.shape != shape {
				continue
			}
			want := 1.5
			if shape == "spread" {
				want = 1.3 // envoyproxy/ratelimit
				if !v.peer.t.redis {
					want = 1.0 // gubernator, in memory
				}
			}
			atLeast(fmt.Sprintf("%s: decisions/s, kurz %s / %s", keys[shape], v.kurz.t.api, v.peer.t.name), v.throughput, want)
		}
	}
	for _, shape := range []string{"spread", "hot"} {
		for _, v := range vs {
			if v.kurz.shape == shape {
				atMost(fmt.Sprintf("%s: limiter CPU per decision, kurz %s / %s", keys[shape], v.kurz.t.api, v.peer.t.name), v.serverCPU, 0.5)
			}
		}
	}
	for _, v := range vs {
		if v.kurz.shape == "spread" {
			all := v.kurz.sources["redis"] > 0 && v.kurz.sources["redis"] == sum(v.kurz.sources)
			t.Add(fmt.Sprintf("%s: every kurz %s answer decided on Redis", keys["spread"], v.kurz.t.api), v.kurz.share("redis"), all)
		}
	}
	t.Write(out, "Issue #15's targets for the limiter, this run:")
}

func fmtMicros(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

func fmtRatio(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "–"
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + " x"
}
