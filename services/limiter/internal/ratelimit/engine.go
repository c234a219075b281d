package ratelimit

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/types/known/durationpb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

//go:embed state.lua
var stateLua string

//go:embed decide.lua
var decideLua string

//go:embed decide_one.lua
var decideOneLua string

// decideSource is the decision script of one request: state.lua's readers,
// decide.lua's decision, then decide_one.lua's entry.
var decideSource = stateLua + decideLua + decideOneLua

// decideScript is loaded once per Redis node and run with EVALSHA; on
// NOSCRIPT, after a restart, a failover or a SCRIPT FLUSH, the engine falls
// back to EVAL, which loads it again (go-redis's Script.Run does the same on
// the direct path).
var decideScript = redis.NewScript(decideSource)

// Options tune an Engine.
type Options struct {
	// Timeout bounds every Redis call; past it, the rules' failure modes
	// decide. The client's socket timeouts must be longer, or go-redis
	// retries a timed-out script and a decision may consume twice.
	Timeout time.Duration
	// Fleet is the number of limiter replicas, live or static: "local"
	// fallback holds limit/size per key in each, and a lease takes at most
	// a 1/size share of what is left of a key. Nil means a static fleet of
	// Replicas.
	Fleet *Fleet
	// Replicas is the static replica count used when Fleet is nil.
	Replicas int
	// BreakerThreshold consecutive failures open a node's circuit breaker
	// for BreakerCooldown (100ms if zero); each failed probe doubles that,
	// up to BreakerMaxCooldown (the larger of 1s and BreakerCooldown if
	// zero).
	BreakerThreshold   int
	BreakerCooldown    time.Duration
	BreakerMaxCooldown time.Duration
	// DenyCacheSize bounds the in-memory cache of over-limit keys.
	DenyCacheSize int
	// LocalCacheSize bounds the number of keys the local fallback tracks.
	LocalCacheSize int
	// AllowLogEvery logs one allowance in this many (every denial is logged).
	AllowLogEvery int64
	// AutoPipeline batches concurrent decisions into one pipeline per Redis
	// node (pipe.go), instead of one round trip each. A decision still waits
	// for its batch only until Timeout.
	AutoPipeline bool
	// KeyPrefix goes before every Redis key the engine's rules use, outside
	// the hash tag (<prefix>rl:{...}), so that limiters sharing a Redis
	// Cluster count apart even on domains of the same name; empty: the
	// keys as they always were. ValidKeyPrefix says what it may hold.
	KeyPrefix string
	// NearLimitRatio is the share of a rule's capacity past which an
	// allowed decision counts as near its limit
	// (kurz_ratelimit_near_limit_total), envoyproxy/ratelimit's
	// NEAR_LIMIT_RATIO: more than 0, at most 1; 0 means
	// DefaultNearLimitRatio.
	NearLimitRatio float64
}

// DefaultNearLimitRatio is envoyproxy/ratelimit's default NEAR_LIMIT_RATIO.
const DefaultNearLimitRatio = 0.8

// Engine evaluates requests against the current Ruleset.
type Engine struct {
	rdb *redis.ClusterClient
	// pipes, when auto-pipelining, batches the decision scripts per node
	// (pipe.go). Nil otherwise: decisions call rdb directly.
	pipes *pipes
	// slotsStale asks Run to reload the slot map now (a redirect, a failed
	// node).
	slotsStale chan struct{}
	rules      atomic.Pointer[Ruleset]
	opts       Options
	log        *slog.Logger
	local      *localLimiter
	breakers   *breakers
	slots      slotMap
	denied     *lru.Cache[string, denial]
	reqPfx     string
	reqSeq     atomic.Uint64
	allowSeq   atomic.Int64
	m          *engineMetrics
	// refunds tracks background refunds so tests and shutdown can wait.
	refunds sync.WaitGroup
	// leases are this replica's leases of leased rules' units (lease.go).
	leases leaseTable
	// denyLogs bounds the denial lines per rule (observe).
	denyLogs denyLimiter
	// fallbackLogs bounds the lines saying why a rule answered by its
	// failure mode: one a second per rule (logFallback).
	fallbackLogs denyLimiter
	// nearMillionths is Options.NearLimitRatio in millionths (nearLimit).
	nearMillionths int64
}

// denial is a cached Redis denial: the key denies any cost >= cost until
// `until` (a monotonic local time; only the duration came from Redis), as
// long as the rule's numbers are still the ones it was decided under.
type denial struct {
	at    time.Time // when Redis denied: res's durations count from it
	until time.Time // answered from memory until then
	cost  int64
	rule  fingerprint
	res   result
}

// fingerprint is what a cached denial depends on: a plan change that alters
// any of it invalidates the denial at once.
type fingerprint struct {
	algorithm ratelimitv1.Algorithm
	limit     int64
	window    time.Duration
	capacity  int64
}

func fingerprintOf(r *Rule) fingerprint {
	return fingerprint{r.Algorithm, r.Limit, r.Window, r.capacity()}
}

// maxDenialTTL caps how long a denial is answered from memory. Until its
// retry-after a denial is exact, except that a cross-slot refund still in
// flight may have caused it; the cap bounds that case to a second.
const maxDenialTTL = time.Second

// result is one rule's verdict.
type result struct {
	allowed    bool
	limit      int64
	remaining  int64
	resetAfter time.Duration
	retryAfter time.Duration
	delay      time.Duration
	source     ratelimitv1.DecisionSource
	never      bool // cost exceeds what the rule can ever hold
	// capacity is the most the rule holds as this decision counts it
	// (remaining out of capacity): the rule's capacity, or this replica's
	// share of it in the local fallback; 0 when the decision knows nothing
	// of what is left (failing open or closed, an unlimited rule).
	capacity int64
}

// NewEngine returns an engine deciding with rules until SetRules replaces them.
// rdb must have ContextTimeoutEnabled, so that context deadlines bound its
// socket I/O: calls that do not go through the auto-pipeliner (decisions
// without it, refunds, Explain) rely on that for their timeouts.
func NewEngine(rdb *redis.ClusterClient, rules *Ruleset, opts Options, log *slog.Logger, mp metric.MeterProvider) (*Engine, error) {
	if opts.Timeout <= 0 {
		return nil, errors.New("ratelimit: timeout must be positive")
	}
	if err := ValidKeyPrefix(opts.KeyPrefix); err != nil {
		return nil, fmt.Errorf("ratelimit: %w", err)
	}
	if opts.NearLimitRatio == 0 {
		opts.NearLimitRatio = DefaultNearLimitRatio
	}
	if !(opts.NearLimitRatio > 0 && opts.NearLimitRatio <= 1) {
		return nil, fmt.Errorf("ratelimit: near-limit ratio %v: want more than 0 and at most 1", opts.NearLimitRatio)
	}
	if opts.BreakerThreshold <= 0 {
		opts.BreakerThreshold = 3
	}
	if opts.BreakerCooldown <= 0 {
		opts.BreakerCooldown = 100 * time.Millisecond
	}
	if opts.BreakerMaxCooldown <= 0 {
		opts.BreakerMaxCooldown = max(time.Second, opts.BreakerCooldown)
	}
	if opts.BreakerMaxCooldown < opts.BreakerCooldown {
		return nil, errors.New("ratelimit: the breaker's longest cooldown is shorter than its first")
	}
	if opts.DenyCacheSize <= 0 {
		opts.DenyCacheSize = 100_000
	}
	if opts.LocalCacheSize <= 0 {
		opts.LocalCacheSize = 100_000
	}
	if opts.Fleet == nil {
		opts.Fleet = StaticFleet(opts.Replicas)
	}
	local, err := newLocalLimiter(opts.Fleet, opts.LocalCacheSize)
	if err != nil {
		return nil, err
	}
	denied, err := lru.New[string, denial](opts.DenyCacheSize)
	if err != nil {
		return nil, err
	}
	m, err := newEngineMetrics(mp)
	if err != nil {
		return nil, err
	}
	var pfx [6]byte
	_, _ = rand.Read(pfx[:])
	e := &Engine{
		rdb: rdb, opts: opts, log: log, local: local, denied: denied, m: m,
		breakers: &breakers{
			threshold: opts.BreakerThreshold, cooldown: opts.BreakerCooldown, maxCooldown: opts.BreakerMaxCooldown,
			byNode: map[string]*breaker{},
		},
		reqPfx:         hex.EncodeToString(pfx[:]),
		fallbackLogs:   denyLimiter{perSecond: FallbackLogsPerSecond},
		nearMillionths: nearMillionths(opts.NearLimitRatio),
	}
	if !rdb.Options().ContextTimeoutEnabled {
		log.Warn("redis client without ContextTimeoutEnabled: calls wait for socket timeouts, not the decision timeout")
	}
	if rdb.Options().MaxRetries >= 0 {
		log.Warn("redis client that resends commands after a broken connection: a refund or a lease's give-back may run twice (redisconn.NoRetries)")
	}
	if opts.AutoPipeline {
		o := rdb.Options()
		e.pipes = newPipes(o.Password, o.TLSConfig, o.DialTimeout, max(o.ReadTimeout, o.WriteTimeout, opts.Timeout))
	}
	e.slotsStale = make(chan struct{}, 1)
	e.SetRules(rules)
	if _, err := e.slots.refresh(context.Background(), rdb, time.Second); err != nil {
		log.Warn("cluster slot map not loaded yet; one breaker covers the cluster until it is", "err", err)
	}
	return e, nil
}

// refreshSlots reloads the slot map and forgets the breakers of nodes that
// are no longer masters.
func (e *Engine) refreshSlots(ctx context.Context) {
	masters, err := e.slots.refresh(ctx, e.rdb, time.Second)
	if err != nil {
		return
	}
	if e.pipes != nil {
		e.pipes.forget(func(node string) bool { return masters[node] })
	}
	if n := e.breakers.forget(func(node string) bool { return masters[node] }); n > 0 {
		e.m.breakerOpen.Add(ctx, int64(-n))
		e.log.InfoContext(ctx, "dropped open breakers of nodes that are no longer masters", "breakers", n)
	}
}

// Run keeps the slot-to-node map of the breakers and pipelines current
// (failovers move slots) until ctx ends, then closes the pipelines.
func (e *Engine) Run(ctx context.Context) {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	if e.pipes != nil {
		defer e.pipes.Close()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			e.refreshSlots(ctx)
		case <-e.slotsStale:
			e.refreshSlots(ctx)
			// At most ten reloads a second however many calls fail
			// while a failover is under way.
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// newReqID returns a request id no other request of this replica has: the
// sliding log's members are "<id>:<n>", so a refund removes exactly them.
func (e *Engine) newReqID() string {
	return e.reqPfx + strconv.FormatUint(e.reqSeq.Add(1), 36)
}

// SetRules replaces the rules, keyed under the engine's key prefix;
// requests in flight finish with the old ones.
func (e *Engine) SetRules(rs *Ruleset) { e.rules.Store(rs.withKeyPrefix(e.opts.KeyPrefix)) }

// Rules returns the current rules.
func (e *Engine) Rules() *Ruleset { return e.rules.Load() }

// Wait blocks until background refunds have finished.
func (e *Engine) Wait() { e.refunds.Wait() }

// Check decides a request of cost units (0 looks without consuming): allowed
// only if every enforced rule allows, and then every rule consumes; if any
// denies, nothing stays consumed.
func (e *Engine) Check(ctx context.Context, domain string, desc map[string]string, cost int64) *ratelimitv1.CheckQuotaResponse {
	_, rules := e.rules.Load().Match(domain, desc)
	resp, _ := e.decide(ctx, "", domain, rules, cost, nil)
	return resp
}

// CheckEach decides one request described by several descriptor sets (as
// Envoy sends them), costs[j] units for set j: the rules matching any set
// are decided together, all or nothing. A cost of 0 checks without
// consuming (Envoy's hits_addend 0, to charge later): a rule only such sets
// match consumes nothing and denies when it has not one unit left, as a
// request of one unit would be denied. owners[i] lists the sets that
// resp.Decisions[i] came from: a key matched by two sets is decided once,
// at the sum of their costs, since one script must not read and write the
// same key as two rules.
func (e *Engine) CheckEach(ctx context.Context, domain string, descs []map[string]string, costs []int64) (resp *ratelimitv1.CheckQuotaResponse, owners [][]int) {
	rs := e.rules.Load()
	if len(descs) == 1 {
		// One set's rules have keys of their own (each names its rule):
		// nothing to merge.
		rules, cost := rs.MatchEnvoy(domain, descs[0]), costs[0]
		if cost == 0 {
			for i := range rules {
				rules[i].checkOnly = true
			}
			cost = 1
		}
		resp, _ := e.decide(ctx, "", domain, rules, cost, nil)
		owners = make([][]int, len(resp.Decisions))
		for i := range owners {
			owners[i] = firstSet
		}
		return resp, owners
	}
	// Each rule is decided at cost 1 weighted by its sets' costs.
	var rules []Applied
	at := map[string]int{}
	for j, d := range descs {
		matched := rs.MatchEnvoy(domain, d)
		for _, a := range matched {
			key := a.Key
			if a.Rule.Unlimited {
				// No state key: one decision per rule, which no state
				// key ("rl:{...") can be.
				key = a.Rule.ID()
			}
			if i, dup := at[key]; dup {
				rules[i].weight += costs[j]
				owners[i] = append(owners[i], j)
				continue
			}
			at[key] = len(rules)
			a.weight = costs[j]
			rules = append(rules, a)
			owners = append(owners, []int{j})
		}
	}
	for i := range rules {
		rules[i].checkOnly = rules[i].weight == 0
	}
	// The over-limit cache answers only for every set with rules: its
	// answer carries the cached rules alone, and a set none of whose
	// rules it holds would come back with no limit and no remaining,
	// where Envoy reports them on every request.
	covers := func(cached []int) bool {
		seen := make([]bool, len(descs)) // the sets a cached rule belongs to
		for _, i := range cached {
			for _, j := range owners[i] {
				seen[j] = true
			}
		}
		for _, o := range owners {
			for _, j := range o {
				if !seen[j] {
					return false
				}
			}
		}
		return true
	}
	resp, cached := e.decide(ctx, "", domain, rules, 1, covers)
	if cached != nil {
		// The over-limit cache answered with its rules' decisions alone.
		from := owners
		owners = make([][]int, len(cached))
		for j, i := range cached {
			owners[j] = from[i]
		}
	}
	return resp, owners
}

// firstSet is the owners of a decision of a request with one descriptor
// set; its capacity is its length, so an append copies it.
var firstSet = []int{0}[:1:1]

// CheckAt is Check with the clock fixed at `at` instead of Redis TIME. It
// exists for tests and the demo, which replay traces at chosen instants; the
// service never calls it and no configuration reaches it. Leases run on
// Redis TIME, so CheckAt decides leased rules on Redis as if unleased.
func (e *Engine) CheckAt(ctx context.Context, at time.Time, domain string, desc map[string]string, cost int64) *ratelimitv1.CheckQuotaResponse {
	_, rules := e.rules.Load().Match(domain, desc)
	resp, _ := e.decide(ctx, strconv.FormatInt(at.UnixMilli(), 10), domain, rules, cost, nil)
	return resp
}

// decideUnlimited decides the request's unlimited rules: allowed, in
// memory, with no limit and nothing counted (envoyproxy/ratelimit passes
// an unlimited descriptor no limit, so it never reaches its cache).
func decideUnlimited(rules []Applied, results []result) {
	for i, a := range rules {
		if a.Rule.Unlimited {
			results[i] = result{allowed: true, source: ratelimitv1.DecisionSource_DECISION_SOURCE_UNLIMITED}
		}
	}
}

// group is the rules of one request that share a hash tag, decided by one
// script call.
type group struct {
	tag  string
	idx  []int
	keys []string
	args []any
	// consumed is set when the script consumed (to refund on an overall
	// denial), at Redis's clock now (ms), which the refund is given.
	consumed bool
	now      int64
	err      error
	// abandoned: Redis did not answer because the caller gave up first;
	// the failure mode answers no one, and nothing counts it as a decision.
	abandoned bool
	// late is the reply of a script the deadline cut while it was on the
	// node's pipeline: it may still run, and its reply, from lateAt on,
	// says whether it consumed (refunded if the request is denied).
	late   *lateReply
	lateAt int
}

// decide is the decision path shared by Check, CheckEach and CheckAt. On a
// denial from the over-limit cache the response carries only the cached
// rules, and cached lists their indexes in rules; otherwise cached is nil and
// the response has one decision per rule. covers, when not nil, must accept
// the cached rules for the cache to answer.
func (e *Engine) decide(ctx context.Context, clock, domain string, rules []Applied, cost int64, covers func(cached []int) bool) (resp *ratelimitv1.CheckQuotaResponse, cached []int) {
	if len(rules) == 0 {
		return e.noRule(ctx, domain), nil
	}
	now := time.Now()
	if cost > 0 && clock == "" {
		if denial, idx := e.cachedDenial(ctx, domain, rules, cost, now, covers); denial != nil {
			return denial, idx
		}
	}

	mode := "check"
	if cost == 0 {
		mode = "peek"
	}
	reqID := e.newReqID()
	results := make([]result, len(rules))
	decideUnlimited(rules, results)
	var ls leased
	if cost > 0 && clock == "" {
		ls = e.decideLeased(ctx, rules, results, cost)
	}
	groups := e.groups(rules, clock, mode, reqID, cost, ls.skip)
	if len(groups) == 1 {
		e.run(ctx, groups[0], rules, results, cost)
	} else {
		var wg sync.WaitGroup
		for _, g := range groups {
			wg.Go(func() { e.run(ctx, g, rules, results, cost) })
		}
		wg.Wait()
	}
	return e.finish(ctx, clock, domain, rules, results, groups, ls, reqID, cost, now), nil
}

// cachedDenial answers a request from the over-limit cache, or returns nil.
// An over-limit key stays over its limit until its retry-after: answer from
// memory, exactly, without a Redis round trip. Only a request of the
// cached denial's own cost: a larger one is denied too, but its
// retry-after is longer (or "never", past the rule's capacity), which only
// Redis can say. The response carries every rule with a live denial, the
// one with the longest retry-after deciding, as on Redis (a request several
// rules denied has them all in the cache, and Envoy gives each descriptor
// its own rule's status), and the unlimited rules, decided in memory as
// ever; the ints are their indexes in rules. covers, when
// not nil, must accept those indexes, else Redis decides.
func (e *Engine) cachedDenial(ctx context.Context, domain string, rules []Applied, cost int64, now time.Time, covers func(cached []int) bool) (*ratelimitv1.CheckQuotaResponse, []int) {
	var (
		idx    []int
		resBuf [4]result // on the stack for up to four cached rules
	)
	results := resBuf[:0]
	cachedAny := false
	for i, a := range rules {
		if a.Rule.Unlimited {
			// Decided in memory, so part of the answer: without it a
			// request with an unlimited descriptor beside a denied one
			// would go to Redis on every denial (covers refusing a set
			// with no cached rule), and its descriptor would report a
			// limit of nothing instead of none.
			idx, results = append(idx, i), append(results, result{allowed: true, source: ratelimitv1.DecisionSource_DECISION_SOURCE_UNLIMITED})
			continue
		}
		if a.Rule.Shadow {
			continue
		}
		if d, ok := e.denied.Get(a.Key); ok && a.units(cost) == d.cost && now.Before(d.until) && d.rule == fingerprintOf(a.Rule) {
			// The answer's durations count down from Redis's: a client
			// told to retry after 40 s is told 39 s a second later, not
			// how long the cache keeps the denial.
			res := d.res
			res.source = ratelimitv1.DecisionSource_DECISION_SOURCE_OVER_LIMIT_CACHE
			elapsed := now.Sub(d.at)
			res.retryAfter = max(res.retryAfter-elapsed, time.Millisecond)
			res.resetAfter = max(res.resetAfter-elapsed, 0)
			idx, results = append(idx, i), append(results, res)
			cachedAny = true
		}
	}
	if !cachedAny || covers != nil && !covers(idx) {
		return nil, nil
	}
	applied := rules[idx[0] : idx[0]+1]
	if len(idx) > 1 {
		applied = make([]Applied, len(idx))
		for j, i := range idx {
			applied[j] = rules[i]
		}
	}
	resp := e.respond(domain, applied, results)
	e.observe(ctx, domain, applied, results, resp, cost, true)
	return resp, idx
}

// finish combines a decided request's results into its response: on a
// denial it gives back what was consumed and remembers the over-limit keys,
// then it counts the decision (unless its caller gave up).
func (e *Engine) finish(ctx context.Context, clock, domain string, rules []Applied, results []result, groups []*group, ls leased, reqID string, cost int64, now time.Time) *ratelimitv1.CheckQuotaResponse {
	resp := e.respond(domain, rules, results)
	if !resp.Allowed && cost > 0 {
		e.giveBack(append(groups, ls.failed...), rules, results, reqID, cost)
		e.giveBackLeased(ls.holds)
		// The rules that allowed consumed nothing (their script wrote
		// nothing, or their units are given back): report what they hold,
		// not what they would have held after this request.
		for i, a := range rules {
			if d := resp.Decisions[i]; d.GetAllowed() && d.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_OPEN && !a.Rule.Unlimited {
				d.Remaining = min(d.Remaining+a.cost(cost), a.Rule.capacity())
				if d.GetSource() == ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
					d.ResetAfter = durationpb.New(unconsumedReset(a.Rule, d.ResetAfter.AsDuration(), d.Remaining, a.cost(cost)))
				}
			}
		}
		for i, a := range rules {
			r := results[i]
			if !r.allowed && !a.Rule.Shadow && r.source == ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS && r.retryAfter > 0 && clock == "" {
				e.denied.Add(a.Key, denial{at: now, until: now.Add(min(r.retryAfter, maxDenialTTL)), cost: a.units(cost), rule: fingerprintOf(a.Rule), res: r})
			}
		}
	}
	abandoned := func(g *group) bool { return g.abandoned }
	if slices.ContainsFunc(groups, abandoned) || slices.ContainsFunc(ls.failed, abandoned) {
		// Nobody receives this answer, and some of it is a failure mode
		// standing in for a Redis that was not slow: counted as decisions
		// and fallbacks, impatient callers set off KurzLimiterFallingBack.
		e.m.abandoned.Add(ctx, 1)
		return resp
	}
	e.observe(ctx, domain, rules, results, resp, cost, false)
	return resp
}

// unconsumedReset is an allowing rule's reset-after once the cost it was
// decided with is not consumed after all (another rule denied), from the
// reset the script reported with it consumed and the remaining without
// it. 0 when back to full; else exact for the buckets (they refill at a
// constant rate; to the script's millisecond) and the fixed window (its
// reset is its window's end); for the sliding log and the sliding window
// counter the reported reset, at most one window longer than theirs.
// unconsumed is an allowing check-only rule's result, decided at one unit,
// as it stands with that unit not taken.
func unconsumed(res result, r *Rule) result {
	if res.allowed {
		res.remaining = min(res.remaining+1, r.capacity())
		res.resetAfter = unconsumedReset(r, res.resetAfter, res.remaining, 1)
	}
	return res
}

func unconsumedReset(r *Rule, reset time.Duration, remaining, cost int64) time.Duration {
	if remaining >= r.capacity() {
		return 0 // full: the script's whole milliseconds would leave a remainder
	}
	switch r.Algorithm {
	case ratelimitv1.Algorithm_ALGORITHM_TOKEN_BUCKET, ratelimitv1.Algorithm_ALGORITHM_LEAKY_BUCKET:
		return max(0, reset-time.Duration(float64(cost)*float64(r.Window)/float64(r.Limit)))
	}
	return reset
}

// The decision script's arguments (decide.lua): clock, mode and request
// id, then decideRuleArgs per rule: algorithm, limit, window, capacity,
// cost (at decideCostArg) and flags.
const (
	decideRuleArgs = 6
	decideCostArg  = 4
)

// groups groups the rules by hash tag, leaving out those skip marks
// (decided from leases) and the unlimited ones (decided in memory).
func (e *Engine) groups(rules []Applied, clock, mode, reqID string, cost int64, skip []bool) []*group {
	var byTag map[string]*group // only for requests whose rules span tags
	var order []*group
	for i, a := range rules {
		if skip != nil && skip[i] || a.Rule.Unlimited {
			continue
		}
		var g *group
		switch {
		case len(order) == 1 && order[0].tag == a.tag:
			g = order[0]
		case len(order) > 0:
			if byTag == nil {
				byTag = map[string]*group{order[0].tag: order[0]}
			}
			g = byTag[a.tag]
		}
		if g == nil {
			args := make([]any, 3, 3+decideRuleArgs*(len(rules)-i))
			args[0], args[1], args[2] = clock, mode, reqID
			g = &group{tag: a.tag, args: args}
			if byTag != nil {
				byTag[a.tag] = g
			}
			order = append(order, g)
		}
		r := a.Rule
		flags := 0
		if r.Queue {
			flags |= 1
		}
		if r.Shadow {
			flags |= 2
		}
		if a.checkOnly {
			flags |= 4
		}
		g.idx = append(g.idx, i)
		g.keys = append(g.keys, a.Key)
		g.args = append(g.args, int(r.Algorithm), r.Limit, r.Window.Milliseconds(), r.capacity(), a.units(cost), flags)
	}
	return order
}

// run decides one group on Redis, or by the rules' failure modes when Redis
// fails, is slow, or its node's breaker is open.
func (e *Engine) run(ctx context.Context, g *group, rules []Applied, results []result, cost int64) {
	vals, err := e.onRedis(ctx, g.keys[0], func(ctx context.Context, node string) ([]int64, error) {
		return e.decideOnRedis(ctx, node, g.keys, g.args)
	})
	if err != nil {
		g.err, g.abandoned, g.late = err, errors.Is(err, errAbandoned), lateReplyOf(err)
		e.fallback(g, rules, results, cost, time.Now())
		return
	}
	g.apply(vals, rules, results)
}

// apply records the decision script's reply for g: vals is {all_allowed,
// now_ms, then 5 values per rule of g}.
// retryOf reads a script's retry_after_ms: -1 means the cost exceeds what
// r ever holds (never), answered as r's window as the API has always done.
func retryOf(ms int64, r *Rule) (retry time.Duration, never bool) {
	if ms < 0 {
		return r.Window, true
	}
	return time.Duration(ms) * time.Millisecond, false
}

func (g *group) apply(vals []int64, rules []Applied, results []result) {
	g.consumed, g.now = vals[0] == 1 && g.args[1] == "check", vals[1]
	for j, i := range g.idx {
		v := vals[2+5*j : 7+5*j]
		r := rules[i].Rule
		res := result{
			allowed:    v[0] == 1,
			limit:      r.Limit,
			capacity:   r.capacity(),
			remaining:  v[1],
			resetAfter: time.Duration(v[2]) * time.Millisecond,
			delay:      time.Duration(v[4]) * time.Millisecond,
			source:     ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS,
		}
		res.retryAfter, res.never = retryOf(v[3], r)
		if rules[i].checkOnly {
			res = unconsumed(res, r)
		}
		if r.Shadow {
			res.source = ratelimitv1.DecisionSource_DECISION_SOURCE_SHADOW
		}
		results[i] = res
	}
}

func (e *Engine) fallback(g *group, rules []Applied, results []result, cost int64, now time.Time) {
	cause := fallbackCause(g.err)
	for _, i := range g.idx {
		a := rules[i]
		r := a.Rule
		var res result
		switch r.FailureMode {
		case ratelimitv1.FailureMode_FAILURE_MODE_CLOSED:
			res = result{limit: r.Limit, retryAfter: e.opts.BreakerMaxCooldown, source: ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED}
		case ratelimitv1.FailureMode_FAILURE_MODE_LOCAL:
			switch {
			case cost == 0:
				res = e.local.peek(a.Key, r, 0, now)
			case a.checkOnly:
				res = unconsumed(e.local.peek(a.Key, r, 1, now), r)
			default:
				res = e.local.take(a.Key, r, a.cost(cost), now)
			}
			res.source = ratelimitv1.DecisionSource_DECISION_SOURCE_LOCAL_FALLBACK
		default:
			// Fail open: what is left is unknown; report the full limit.
			res = result{allowed: true, limit: r.Limit, remaining: r.Limit, source: ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_OPEN}
		}
		if r.Shadow {
			res.source = ratelimitv1.DecisionSource_DECISION_SOURCE_SHADOW
		}
		if !g.abandoned {
			e.m.fallbacks.Add(context.Background(), 1, e.m.fallbackAttrs.Get(fallbackKey{r.Domain, r.Name, res.source, cause}, func() []attribute.KeyValue {
				return []attribute.KeyValue{attribute.String("rule", r.ID()), attribute.String("source", sourceName(res.source)), attribute.String("cause", cause)}
			}).Add...)
		}
		results[i] = res
	}
	if !g.abandoned {
		e.logFallback(g, rules, cause)
	}
}

// giveBack undoes what the groups and local buckets consumed for a request
// that another rule denied. It runs in the background: the answer is already
// known, and until it lands the consumed units are briefly unavailable to
// other requests of the same keys (the bounded imprecision of rules that
// span hash slots).
//
// A group whose script the deadline cut on its pipeline was answered by
// its failure modes, but the script may still run once its node wakes: its
// late reply is awaited, and what it says it consumed is given back too. A
// denied request then consumes nothing, even when a stall denied it
// (failure mode closed, or a local share spent); refunding without that
// reply would hand back units nothing took.
func (e *Engine) giveBack(groups []*group, rules []Applied, results []result, reqID string, cost int64) {
	for _, g := range groups {
		switch {
		case g.consumed:
			args := g.refundArgs(g.now, reqID, func(j int) bool { return results[g.idx[j]].allowed })
			e.refunds.Go(func() { e.refund(g.keys, args) })
		case g.late != nil && g.args[1] == "check":
			e.refunds.Go(func() {
				vals, ok := g.late.wait()
				n := 2 + 5*len(g.idx)
				if !ok || len(vals) < g.lateAt+n {
					return // not run, or its reply is lost: nothing known to give back
				}
				v := vals[g.lateAt : g.lateAt+n]
				if v[0] != 1 {
					return // denied (or not run, in a batch): nothing consumed
				}
				e.refund(g.keys, g.refundArgs(v[1], reqID, func(j int) bool { return v[2+5*j] == 1 }))
			})
		}
		if g.err != nil {
			for _, i := range g.idx {
				if results[i].allowed && results[i].source == ratelimitv1.DecisionSource_DECISION_SOURCE_LOCAL_FALLBACK {
					e.local.refund(rules[i].Key, rules[i].Rule, rules[i].cost(cost))
				}
			}
		}
	}
}

// refundArgs are the arguments of the script that gives back what g's
// decision consumed at Redis's clock now (ms); allowed(j) tells whether
// g's j-th rule allowed: a shadow rule that would have denied wrote
// nothing, and gets nothing back (cost 0), nor does a check-only rule.
func (g *group) refundArgs(now int64, reqID string, allowed func(j int) bool) []any {
	args := append([]any{now, "refund", reqID}, g.args[3:]...)
	for j := range g.idx {
		if !allowed(j) || args[3+decideRuleArgs*j+decideRuleArgs-1].(int)&4 != 0 {
			args[3+decideRuleArgs*j+decideCostArg] = 0
		}
	}
	return args
}

// refund runs the refund script on keys with args.
func (e *Engine) refund(keys []string, args []any) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*e.opts.Timeout)
	defer cancel()
	if err := decideScript.Run(ctx, e.rdb, keys, args...).Err(); err != nil {
		e.log.Warn("refund failed; the units return when the window or bucket refills", "keys", keys, "err", err)
	}
}
