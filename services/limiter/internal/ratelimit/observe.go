package ratelimit

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/telemetry"
)

func sourceName(s ratelimitv1.DecisionSource) string {
	switch s {
	case ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS:
		return "redis"
	case ratelimitv1.DecisionSource_DECISION_SOURCE_LOCAL_FALLBACK:
		return "local_fallback"
	case ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_OPEN:
		return "fail_open"
	case ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED:
		return "fail_closed"
	case ratelimitv1.DecisionSource_DECISION_SOURCE_SHADOW:
		return "shadow"
	case ratelimitv1.DecisionSource_DECISION_SOURCE_NO_RULE:
		return "no_rule"
	case ratelimitv1.DecisionSource_DECISION_SOURCE_LEASE:
		return "lease"
	case ratelimitv1.DecisionSource_DECISION_SOURCE_OVER_LIMIT_CACHE:
		return "over_limit_cache"
	case ratelimitv1.DecisionSource_DECISION_SOURCE_UNLIMITED:
		return "unlimited"
	}
	return "unspecified"
}

// noRule is the answer to a request no rule applies to: allowed, counted
// as one decision of source no_rule and no rule, so that an operator sees
// callers whose checks match nothing (a domain's rules deleted, a
// descriptor misspelt). The domain is the caller's choice: one the rules
// do not name is counted as "" rather than grow a series per name.
func (e *Engine) noRule(ctx context.Context, domain string) *ratelimitv1.CheckQuotaResponse {
	if !e.rules.Load().HasDomain(domain) {
		domain = ""
	}
	e.m.decisions.Add(ctx, 1, e.m.decisionAttrs(domain, "", "allowed", ratelimitv1.DecisionSource_DECISION_SOURCE_NO_RULE).Add...)
	return &ratelimitv1.CheckQuotaResponse{Allowed: true, Source: ratelimitv1.DecisionSource_DECISION_SOURCE_NO_RULE}
}

// observe counts the decision per rule, and the rules' allowances near
// their limits, and writes the decision log: the denials (rule, key, what
// was left, retry-after, how served), at most DenyLogsPerSecond a second
// per deciding rule (the next line says how many were not logged), and a
// sample of allowances. cost is the request's, as decided.
func (e *Engine) observe(ctx context.Context, domain string, rules []Applied, results []result, resp *ratelimitv1.CheckQuotaResponse, cost int64, cached bool) {
	for i, a := range rules {
		res := results[i]
		outcome := "allowed"
		if !res.allowed {
			outcome = "denied"
		}
		e.m.decisions.Add(ctx, 1, e.m.decisionAttrs(domain, a.Rule.Name, outcome, res.source).Add...)
		if a.cost(cost) > 0 && e.nearLimit(res) {
			e.m.nearLimit.Add(ctx, 1, e.m.nearAttrs(domain, a.Rule.Name).Add...)
		}
	}
	if resp.Allowed {
		if e.opts.AllowLogEvery <= 0 || e.allowSeq.Add(1)%e.opts.AllowLogEvery != 0 {
			return
		}
	}
	level, msg := slog.LevelInfo, "quota allowed (sampled)"
	var suppressed int64
	if !resp.Allowed {
		level, msg = slog.LevelWarn, "quota denied"
		var ok bool
		if ok, suppressed = e.denyLogs.take(domain, resp.DecidingRule); !ok {
			return
		}
	}
	// Typed attributes (LogAttrs): the "key", value pairs of Log box every
	// number and bool and are parsed back into attributes on each call, a
	// cost paid on every denial.
	attrs := make([]slog.Attr, 0, 5+len(rules))
	attrs = append(attrs, slog.String("domain", domain), slog.String("deciding_rule", resp.DecidingRule),
		slog.String("source", sourceName(resp.Source)), slog.Bool("from_deny_cache", cached))
	if suppressed > 0 {
		attrs = append(attrs, slog.Int64("denials_not_logged", suppressed))
	}
	for i, a := range rules {
		res := results[i]
		attrs = append(attrs, slog.Attr{Key: a.Rule.Name, Value: slog.GroupValue(
			slog.String("key", a.Key), slog.String("plan", a.Plan), slog.String("algorithm", AlgorithmName(a.Rule.Algorithm)),
			slog.Bool("allowed", res.allowed), slog.Int64("limit", res.limit), slog.Int64("remaining", res.remaining),
			slog.Duration("window", a.Rule.Window), slog.Duration("retry_after", res.retryAfter), slog.Duration("reset_after", res.resetAfter),
			slog.String("source", sourceName(res.source)), slog.Bool("cost_exceeds_capacity", res.never))})
	}
	e.log.LogAttrs(ctx, level, msg, attrs...)
}

// nearLimit reports whether res left its rule near its limit: allowed,
// with more than NearLimitRatio of the rule's capacity used once the
// request took its units. That is envoyproxy/ratelimit's near_limit: a hit
// allowed while the count it makes is above floor(limit × ratio), so of a
// limit of 10 at 0.8 the 9th and 10th. The caller counts only decisions
// that took units, as a hits_addend of 0 adds nothing to its stats. A
// rule whose failure mode answered knows nothing of what is left, and
// counts only from its local share.
func (e *Engine) nearLimit(res result) bool {
	if !res.allowed || res.capacity <= 0 {
		return false
	}
	// In integers: 0.29 of 100 is 29, where float64 arithmetic gives
	// 28.999..., and a capacity of at most MaxLimit (2^40) times a million
	// stays far inside an int64.
	return res.capacity-res.remaining > res.capacity*e.nearMillionths/1_000_000
}

// nearMillionths is a near-limit ratio (0 < ratio <= 1) in millionths.
func nearMillionths(ratio float64) int64 {
	return int64(math.Round(ratio * 1_000_000))
}

type engineMetrics struct {
	decisions     metric.Int64Counter
	fallbacks     metric.Int64Counter
	abandoned     metric.Int64Counter
	redisDuration metric.Float64Histogram
	breakerOpen   metric.Int64UpDownCounter
	// redisOutcome holds the two attribute sets of redisDuration.
	redisOutcome map[bool]telemetry.Opts
	// fallbackAttrs caches the fallback counter's sets, by rule and source.
	fallbackAttrs *telemetry.AttrSets[fallbackKey]
	// batchRequests counts CheckMany's requests sent in batches, by
	// outcome (batchedSet, reroutedSet).
	batchRequests           metric.Int64Counter
	batchedSet, reroutedSet telemetry.Opts
	// attrs caches decision attribute sets: building one per decision is
	// most of the metrics' cost on the hot path.
	attrs *telemetry.AttrSets[decisionKey]
	// nearLimit counts the allowances that left a rule near its limit,
	// by domain and rule (nearLimitAttrs).
	nearLimit      metric.Int64Counter
	nearLimitAttrs *telemetry.AttrSets[ruleKey]
}

type fallbackKey struct {
	domain, rule string
	source       ratelimitv1.DecisionSource
	cause        string
}

// fallbackCause names, from a bounded set, why a decision went without
// Redis (err, the failed call's): what the fallbacks counter and the
// fallback's log line say, as "quota denied ... source: fail_closed"
// reads the same whatever the cause.
func fallbackCause(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, errBreakerOpen):
		return "breaker_open"
	case redis.IsTryAgainError(err) || strings.Contains(errText(err), "TRYAGAIN "):
		// A slot being migrated with a script's keys on both nodes (or one
		// on neither) past the call's deadline.
		return "tryagain"
	case redis.IsClusterDownError(err) || strings.Contains(errText(err), "CLUSTERDOWN "):
		return "clusterdown"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case isScriptError(err):
		return "redis_error"
	}
	return "other"
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// FallbackLogsPerSecond bounds the lines per rule saying why it answered
// by its failure mode: Redis down fails every decision, and each line says
// how many were not logged since the last.
const FallbackLogsPerSecond = 1

// logFallback logs, at most FallbackLogsPerSecond a second per rule (g's
// first), why g's rules answered by their failure modes.
func (e *Engine) logFallback(g *group, rules []Applied, cause string) {
	first := rules[g.idx[0]]
	ok, suppressed := e.fallbackLogs.take(first.Rule.Domain, first.Rule.Name)
	if !ok {
		return
	}
	names := make([]string, len(g.idx))
	for j, i := range g.idx {
		names[j] = rules[i].Rule.Name
	}
	attrs := []slog.Attr{slog.String("domain", first.Rule.Domain), slog.Any("rules", names), slog.String("key", first.Key),
		slog.String("cause", cause), slog.Any("err", g.err)}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int64("fallbacks_not_logged", suppressed))
	}
	e.log.LogAttrs(context.Background(), slog.LevelWarn, "redis decision failed; the rules answered by their failure modes", attrs...)
}

type decisionKey struct {
	domain, rule, outcome string
	source                ratelimitv1.DecisionSource
}

func (m *engineMetrics) decisionAttrs(domain, rule, outcome string, source ratelimitv1.DecisionSource) telemetry.Opts {
	return m.attrs.Get(decisionKey{domain, rule, outcome, source}, func() []attribute.KeyValue {
		return []attribute.KeyValue{
			attribute.String("domain", domain), attribute.String("rule", rule),
			attribute.String("outcome", outcome), attribute.String("source", sourceName(source)),
		}
	})
}

// nearAttrs is the near-limit counter's attribute set of a rule.
func (m *engineMetrics) nearAttrs(domain, rule string) telemetry.Opts {
	return m.nearLimitAttrs.Get(ruleKey{domain, rule}, func() []attribute.KeyValue {
		return []attribute.KeyValue{attribute.String("domain", domain), attribute.String("rule", rule)}
	})
}

func newEngineMetrics(mp metric.MeterProvider) (*engineMetrics, error) {
	m := mp.Meter("kurz.dev/services/limiter")
	em := &engineMetrics{
		attrs:          telemetry.NewAttrSets[decisionKey](telemetry.SeriesLimit, telemetry.Overflow),
		fallbackAttrs:  telemetry.NewAttrSets[fallbackKey](telemetry.SeriesLimit, telemetry.Overflow),
		nearLimitAttrs: telemetry.NewAttrSets[ruleKey](telemetry.SeriesLimit, telemetry.Overflow),
	}
	var err, e2 error
	em.decisions, err = m.Int64Counter("kurz.ratelimit.decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Rule decisions by domain, rule, outcome and how they were served"))
	em.nearLimit, e2 = m.Int64Counter("kurz.ratelimit.near_limit", metric.WithUnit("{decision}"),
		metric.WithDescription("Allowed rule decisions that took units and left the rule with more than KURZ_LIMITER_NEAR_LIMIT_RATIO of its capacity used (envoyproxy/ratelimit's near_limit), by domain and rule"))
	err = errors.Join(err, e2)
	em.fallbacks, e2 = m.Int64Counter("kurz.ratelimit.fallbacks", metric.WithUnit("{decision}"),
		metric.WithDescription("Rule decisions made without Redis, by rule, failure mode and cause (timeout, refused, tryagain, clusterdown, breaker_open, redis_error, other)"))
	err = errors.Join(err, e2)
	em.abandoned, e2 = m.Int64Counter("kurz.ratelimit.abandoned", metric.WithUnit("{request}"),
		metric.WithDescription("Requests whose caller gave up before Redis answered: not counted as decisions or fallbacks"))
	err = errors.Join(err, e2)
	em.redisDuration, e2 = m.Float64Histogram("kurz.ratelimit.redis.duration", metric.WithUnit("s"),
		metric.WithDescription("Latency of decision script calls on Redis (a CheckQuotas batch is one call)"),
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1))
	err = errors.Join(err, e2)
	em.breakerOpen, e2 = m.Int64UpDownCounter("kurz.ratelimit.breakers.open", metric.WithUnit("{breaker}"),
		metric.WithDescription("Redis nodes whose circuit breaker is open"))
	err = errors.Join(err, e2)
	em.batchRequests, e2 = m.Int64Counter("kurz.ratelimit.batch.requests", metric.WithUnit("{request}"),
		metric.WithDescription("CheckQuotas requests sent to Redis in batches, by outcome: batched (decided in the batch), rerouted (the batch's node did not serve the key, or the batch could not run there: decided again on its own)"))
	em.batchedSet, em.reroutedSet = telemetry.OptsOf(attribute.String("outcome", "batched")), telemetry.OptsOf(attribute.String("outcome", "rerouted"))
	em.redisOutcome = map[bool]telemetry.Opts{
		false: telemetry.OptsOf(attribute.Bool("error", false)),
		true:  telemetry.OptsOf(attribute.Bool("error", true)),
	}
	return em, errors.Join(err, e2)
}

// DenyLogsPerSecond bounds the denial lines per deciding rule: a hot key is
// denied tens of thousands of times a second, and one CheckQuotas call of
// anyone reaching the limiter carries 1,000 checks (each a line: 4.4 MB of
// log from 820 KB of requests). Every denial is still counted in
// kurz_ratelimit_decisions_total.
const DenyLogsPerSecond = 10

// denyLimiter is a token bucket of perSecond lines per (domain, rule),
// holding as many; the zero value is ready, at DenyLogsPerSecond.
type denyLimiter struct {
	mu        sync.Mutex
	buckets   map[ruleKey]*denyBucket
	now       func() time.Time // time.Now when nil (tests set it)
	perSecond float64          // DenyLogsPerSecond when 0
}

// ruleKey is a rule by domain and name.
type ruleKey struct{ domain, rule string }

type denyBucket struct {
	tokens     float64
	last       time.Time
	suppressed int64
}

// take reports whether a denial of rule may be logged now and, if so, how
// many were not since the last line.
func (l *denyLimiter) take(domain, rule string) (bool, int64) {
	now := time.Now
	if l.now != nil {
		now = l.now
	}
	t := now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buckets == nil {
		l.buckets = map[ruleKey]*denyBucket{}
	}
	rate := l.perSecond
	if rate <= 0 {
		rate = DenyLogsPerSecond
	}
	b := l.buckets[ruleKey{domain, rule}]
	if b == nil {
		// Rules come from the configuration: the map stays small.
		b = &denyBucket{tokens: rate, last: t}
		l.buckets[ruleKey{domain, rule}] = b
	}
	b.tokens = min(rate, b.tokens+t.Sub(b.last).Seconds()*rate)
	b.last = t
	if b.tokens < 1 {
		b.suppressed++
		return false, 0
	}
	b.tokens--
	n := b.suppressed
	b.suppressed = 0
	return true, n
}
