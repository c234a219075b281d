package ratelimit

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/testkit/metrictest"
)

// nearEngine is an engine without Redis whose metrics reader collects,
// counting near-limit allowances at ratio, its local fallback sharing
// among replicas.
func nearEngine(t *testing.T, ratio float64, replicas int) (*Engine, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	m, err := newEngineMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	local, err := newLocalLimiter(StaticFleet(replicas), 100)
	if err != nil {
		t.Fatal(err)
	}
	denied, err := lru.New[string, denial](100)
	if err != nil {
		t.Fatal(err)
	}
	return &Engine{
		log: slog.New(slog.DiscardHandler), m: m, local: local, denied: denied,
		opts: Options{BreakerMaxCooldown: time.Second}, nearMillionths: nearMillionths(ratio),
	}, reader
}

// onRedis is a's result as the engine reads a decision script's reply in
// mode ("check" or "peek"): allowed or not, remaining left once the
// request's units are taken.
func onRedis(a Applied, mode string, allowed bool, remaining int64) result {
	ok := int64(0)
	if allowed {
		ok = 1
	}
	g := &group{idx: []int{0}, args: []any{"", mode, "req"}}
	results := make([]result, 1)
	g.apply([]int64{ok, 1_800_000_000_000, ok, remaining, 1000, 0, 0}, []Applied{a}, results)
	return results[0]
}

// byFailureMode is a's result when Redis failed, by a's failure mode.
func (e *Engine) byFailureMode(a Applied, cost int64) result {
	results := make([]result, 1)
	e.fallback(&group{idx: []int{0}, keys: []string{a.Key}, err: errors.New("redis down")}, []Applied{a}, results, cost, time.Now())
	return results[0]
}

func nearRule(name string, algorithm ratelimitv1.Algorithm, limit, burst int64) *Rule {
	return &Rule{Domain: "d", Name: name, Algorithm: algorithm, Limit: limit, Burst: burst, Window: time.Hour}
}

// observeOne counts res, a's decision in a request of cost, as the engine
// counts every decision it answers.
func (e *Engine) observeOne(a Applied, res result, cost int64) {
	resp := &ratelimitv1.CheckQuotaResponse{Allowed: res.allowed || a.Rule.Shadow, DecidingRule: a.Rule.Name}
	e.observe(context.Background(), "d", []Applied{a}, []result{res}, resp, cost, false)
}

func nearCount(t *testing.T, reader *sdkmetric.ManualReader, rule string) int64 {
	t.Helper()
	return metrictest.Counter(t, reader, "kurz.ratelimit.near_limit", "rule", rule)
}

// kurz_ratelimit_near_limit_total counts what envoyproxy/ratelimit's
// near_limit counts: a decision that allowed and took units, leaving its
// rule with more than the ratio (0.8) of its capacity used. Of a limit of
// 10, the 9th and 10th; never a denial, a look (hits_addend 0), or a rule
// whose failure mode answered without knowing what is left; a shadow rule
// by what it would have decided, as envoyproxy/ratelimit counts a shadow
// limit's stats like any other's.
func TestNearLimitCountsAllowancesPastTheRatio(t *testing.T) {
	const (
		window = ratelimitv1.Algorithm_ALGORITHM_FIXED_WINDOW
		bucket = ratelimitv1.Algorithm_ALGORITHM_TOKEN_BUCKET
	)
	e, reader := nearEngine(t, 0.8, 1)
	open, closed := ratelimitv1.FailureMode_FAILURE_MODE_OPEN, ratelimitv1.FailureMode_FAILURE_MODE_CLOSED
	for _, c := range []struct {
		name string
		// decide returns the rule's decision, a the rule as applied.
		decide func(a *Applied) result
		cost   int64
		want   int64
	}{
		{"8-of-10-used", func(a *Applied) result { return onRedis(*a, "check", true, 2) }, 1, 0},
		{"9-of-10-used", func(a *Applied) result { return onRedis(*a, "check", true, 1) }, 1, 1},
		{"10-of-10-used", func(a *Applied) result { return onRedis(*a, "check", true, 0) }, 1, 1},
		{"denied", func(a *Applied) result { return onRedis(*a, "check", false, 0) }, 1, 0},
		{"several-units-count-once", func(a *Applied) result { return onRedis(*a, "check", true, 0) }, 5, 1},
		{"peek", func(a *Applied) result { return onRedis(*a, "peek", true, 0) }, 0, 0},
		{"check-only", func(a *Applied) result {
			a.checkOnly = true // an Envoy descriptor's hits_addend 0
			return onRedis(*a, "check", true, 0)
		}, 1, 0},
		{"shadow-allowed", func(a *Applied) result {
			a.Rule.Shadow = true
			return onRedis(*a, "check", true, 1)
		}, 1, 1},
		{"shadow-would-deny", func(a *Applied) result {
			a.Rule.Shadow = true
			return onRedis(*a, "check", false, 0)
		}, 1, 0},
		{"unlimited", func(a *Applied) result {
			a.Rule.Unlimited = true
			results := make([]result, 1)
			decideUnlimited([]Applied{*a}, results)
			return results[0]
		}, 1, 0},
		{"fail-closed", func(a *Applied) result {
			a.Rule.FailureMode = closed
			return e.byFailureMode(*a, 1)
		}, 1, 0},
		{"lease-allowance", func(a *Applied) result {
			return (&lease{rule: a.Rule, left: 1, remaining: 0}).allowance(time.Now())
		}, 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := Applied{Rule: nearRule(c.name, window, 10, 0), Key: "rl:{d:" + c.name + "}"}
			res := c.decide(&a)
			e.observeOne(a, res, c.cost)
			if got := nearCount(t, reader, c.name); got != c.want {
				t.Errorf("near-limit count %d, want %d (decision: allowed=%v remaining=%d source=%v)",
					got, c.want, res.allowed, res.remaining, sourceName(res.source))
			}
		})
	}

	// A bucket holds its burst, not its limit: 16 of 20 used is at the
	// ratio, 17 past it.
	for _, c := range []struct {
		name      string
		remaining int64
		want      int64
	}{{"bucket-16-of-20-used", 4, 0}, {"bucket-17-of-20-used", 3, 1}} {
		a := Applied{Rule: nearRule(c.name, bucket, 10, 20), Key: "rl:{d:" + c.name + "}"}
		e.observeOne(a, onRedis(a, "check", true, c.remaining), 1)
		if got := nearCount(t, reader, c.name); got != c.want {
			t.Errorf("%s: near-limit count %d, want %d", c.name, got, c.want)
		}
	}

	// Failing open reports the limit as remaining, which of a burst of 100
	// would read as 90 used: nothing is known, nothing counted, whether
	// the rule enforces or shadows.
	for _, shadow := range []bool{false, true} {
		name := "fail-open"
		if shadow {
			name = "shadow-fail-open"
		}
		r := nearRule(name, bucket, 10, 100)
		r.FailureMode, r.Shadow = open, shadow
		a := Applied{Rule: r, Key: "rl:{d:" + name + "}"}
		res := e.byFailureMode(a, 1)
		e.observeOne(a, res, 1)
		if got := nearCount(t, reader, name); got != 0 || !res.allowed {
			t.Errorf("%s: allowed=%v, near-limit count %d; want allowed, 0", name, res.allowed, got)
		}
	}
}

// The local fallback counts from this replica's share: of a limit of 10
// on two replicas (5 each), the 5th unit taken is past 0.8 of the share,
// and the 6th is denied.
func TestNearLimitCountsTheLocalShare(t *testing.T) {
	e, reader := nearEngine(t, 0.8, 2)
	r := nearRule("local", ratelimitv1.Algorithm_ALGORITHM_FIXED_WINDOW, 10, 0)
	r.FailureMode = ratelimitv1.FailureMode_FAILURE_MODE_LOCAL
	a := Applied{Rule: r, Key: "rl:{d:local}"}
	for i := 1; i <= 6; i++ {
		res := e.byFailureMode(a, 1)
		if res.allowed != (i <= 5) || res.source != ratelimitv1.DecisionSource_DECISION_SOURCE_LOCAL_FALLBACK {
			t.Fatalf("take %d: allowed=%v source=%v; want allowed up to the 5th, from the local fallback", i, res.allowed, sourceName(res.source))
		}
		e.observeOne(a, res, 1)
		want := int64(0)
		if i >= 5 {
			want = 1
		}
		if got := nearCount(t, reader, "local"); got != want {
			t.Errorf("after take %d: near-limit count %d, want %d", i, got, want)
		}
	}
}

// The threshold is floor(capacity × ratio) exactly: 0.29 of 100 is 29
// (float64 arithmetic gives 28.999...), so 29 used is not past it and 30
// is. At 1, no allowance is past the whole capacity.
func TestNearLimitThresholdIsExact(t *testing.T) {
	for _, c := range []struct {
		ratio               float64
		capacity, remaining int64
		want                bool
	}{
		{0.29, 100, 71, false},
		{0.29, 100, 70, true},
		{0.8, 12, 3, false}, // 9 used of 12: floor(9.6) = 9
		{0.8, 12, 2, true},
		{1, 10, 0, false},
		{0.000001, MaxLimit, MaxLimit - 1_099_511, false}, // floor(2^40 / 10^6) used
		{0.000001, MaxLimit, MaxLimit - 1_099_512, true},
	} {
		e, _ := nearEngine(t, c.ratio, 1)
		res := result{allowed: true, capacity: c.capacity, remaining: c.remaining}
		if got := e.nearLimit(res); got != c.want {
			t.Errorf("ratio %v, %d of %d used: near=%v, want %v", c.ratio, c.capacity-c.remaining, c.capacity, got, c.want)
		}
	}
}

// A rule counts by its own decision, whatever the request's other rules
// decide: one that allowed near its limit beside one that denied is
// counted (its outcome in kurz_ratelimit_decisions_total is "allowed" too,
// and envoyproxy/ratelimit counts each descriptor's hits on their own),
// though the denial leaves it what it had before and the response says
// so.
func TestNearLimitCountsARuleByItsOwnDecision(t *testing.T) {
	e, reader := nearEngine(t, 0.8, 1)
	window := ratelimitv1.Algorithm_ALGORITHM_FIXED_WINDOW
	rules := []Applied{
		{Rule: nearRule("per-user", window, 10, 0), Key: "rl:{d:u}:per-user"},
		{Rule: nearRule("per-ip", window, 10, 0), Key: "rl:{d:u}:per-ip"},
	}
	g := &group{tag: "d:u", idx: []int{0, 1}, keys: []string{rules[0].Key, rules[1].Key}, args: []any{"", "check", "req"}}
	results := make([]result, 2)
	// per-user allowed with 0 left, per-ip denied: the script took nothing.
	g.apply([]int64{0, 1_800_000_000_000, 1, 0, 1000, 0, 0, 0, 0, 1000, 1000, 0}, rules, results)
	resp := e.finish(context.Background(), "", "d", rules, results, []*group{g}, leased{}, "req", 1, time.Now())
	if d := resp.GetDecisions()[0]; resp.Allowed || d.GetRule() != "per-user" || d.GetRemaining() != 1 {
		t.Fatalf("response %v: want denied, per-user reporting 1 left (nothing taken)", resp)
	}
	if got := nearCount(t, reader, "per-user"); got != 1 {
		t.Errorf("per-user near-limit count %d, want 1", got)
	}
	if got := nearCount(t, reader, "per-ip"); got != 0 {
		t.Errorf("per-ip (denied) near-limit count %d, want 0", got)
	}
}

// Counting a near-limit allowance costs the decision path no allocation:
// its attribute set is built once per rule, as the decisions counter's.
func TestNearLimitCountAllocatesNothing(t *testing.T) {
	e, reader := nearEngine(t, 0.8, 1)
	a := Applied{Rule: nearRule("hot", ratelimitv1.Algorithm_ALGORITHM_FIXED_WINDOW, 10, 0), Key: "rl:{d:hot}"}
	rules, results := []Applied{a}, []result{onRedis(a, "check", true, 0)}
	resp := &ratelimitv1.CheckQuotaResponse{Allowed: true, DecidingRule: "hot"}
	observe := func() { e.observe(context.Background(), "d", rules, results, resp, 1, false) }
	observe() // builds the rule's attribute sets
	allocs := testing.AllocsPerRun(1000, observe)
	if allocs != 0 {
		t.Errorf("an allowance near the limit costs %.1f allocations to count, want 0", allocs)
	}
	if got := nearCount(t, reader, "hot"); got != 1002 {
		t.Errorf("near-limit count %d, want 1002 (every run counted)", got)
	}
}
