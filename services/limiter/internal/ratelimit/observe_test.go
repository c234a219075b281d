package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/testkit/metrictest"
)

func observingEngine(t *testing.T, w io.Writer) *Engine {
	t.Helper()
	m, err := newEngineMetrics(noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	return &Engine{log: slog.New(slog.NewJSONHandler(w, nil)), m: m}
}

func denialOf(r *Rule) ([]Applied, []result, *ratelimitv1.CheckQuotaResponse) {
	return []Applied{{Rule: r, Key: "rl:{d:" + r.Name + ":x}", Plan: "pro"}},
		[]result{{limit: r.Limit, retryAfter: time.Second, source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS}},
		&ratelimitv1.CheckQuotaResponse{DecidingRule: r.Name, Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS}
}

// A denial's line names each rule as a group of its figures.
func TestDenialLineHasEveryRulesFigures(t *testing.T) {
	var b strings.Builder
	e := observingEngine(t, &b)
	r := &Rule{Domain: "d", Name: "per-user", Algorithm: ratelimitv1.Algorithm_ALGORITHM_FIXED_WINDOW, Limit: 10, Window: time.Minute}
	rules, results, resp := denialOf(r)
	e.observe(context.Background(), "d", rules, results, resp, 1, true)

	var line struct {
		Level         string `json:"level"`
		Msg           string `json:"msg"`
		DecidingRule  string `json:"deciding_rule"`
		FromDenyCache bool   `json:"from_deny_cache"`
		Rule          struct {
			Key        string `json:"key"`
			Plan       string `json:"plan"`
			Algorithm  string `json:"algorithm"`
			Allowed    *bool  `json:"allowed"`
			Limit      int64  `json:"limit"`
			Window     int64  `json:"window"`
			RetryAfter int64  `json:"retry_after"`
			Source     string `json:"source"`
		} `json:"per-user"`
	}
	if err := json.Unmarshal([]byte(b.String()), &line); err != nil {
		t.Fatalf("log line %q: %v", b.String(), err)
	}
	got := line.Rule
	if line.Level != "WARN" || line.Msg != "quota denied" || line.DecidingRule != "per-user" || !line.FromDenyCache ||
		got.Key != "rl:{d:per-user:x}" || got.Plan != "pro" || got.Algorithm != "fixed_window" || got.Allowed == nil || *got.Allowed ||
		got.Limit != 10 || got.Window != int64(time.Minute) || got.RetryAfter != int64(time.Second) || got.Source != "redis" {
		t.Errorf("denial line = %s", b.String())
	}
}

// The line is built from typed attributes: Log's key-value pairs boxed
// every number and were parsed back on each denial (13 allocations for one
// rule against 3).
func TestDenialLineAllocations(t *testing.T) {
	e := observingEngine(t, io.Discard)
	now := time.Unix(1_800_000_000, 0)
	e.denyLogs.now = func() time.Time { now = now.Add(time.Second); return now } // every denial logged
	rules, results, resp := denialOf(&Rule{Domain: "d", Name: "per-user", Limit: 10, Window: time.Minute})
	allocs := testing.AllocsPerRun(200, func() { e.observe(context.Background(), "d", rules, results, resp, 1, true) })
	if allocs > 4 {
		t.Errorf("a one-rule denial costs %.0f allocations, want at most 4", allocs)
	}
}

// Denial lines are bounded per deciding rule: one CheckQuotas call from
// anyone reaching the limiter (1,000 checks) wrote 901 lines. Past
// DenyLogsPerSecond a second the rest are counted, and the next line says
// how many were not logged; another rule has a bucket of its own.
func TestDenialLinesAreBoundedPerRule(t *testing.T) {
	var b strings.Builder
	e := observingEngine(t, &b)
	now := time.Unix(1_800_000_000, 0)
	e.denyLogs.now = func() time.Time { return now }
	hot := &Rule{Domain: "d", Name: "per-user", Limit: 10, Window: time.Minute}
	other := &Rule{Domain: "d", Name: "per-ip", Limit: 10, Window: time.Minute}
	deny := func(r *Rule, n int) {
		rules, results, resp := denialOf(r)
		for range n {
			e.observe(context.Background(), "d", rules, results, resp, 1, false)
		}
	}
	lines := func() []string {
		out := strings.Split(strings.TrimSpace(b.String()), "\n")
		b.Reset()
		return out
	}
	deny(hot, 1000)
	if got := lines(); len(got) != DenyLogsPerSecond {
		t.Fatalf("1,000 denials in an instant wrote %d lines, want %d", len(got), DenyLogsPerSecond)
	}
	deny(other, 1)
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], `"deciding_rule":"per-ip"`) {
		t.Errorf("another rule's denial: %q, want its line", got)
	}
	now = now.Add(time.Second / 2)
	deny(hot, 100)
	got := lines()
	if len(got) != DenyLogsPerSecond/2 || !strings.Contains(got[0], fmt.Sprintf(`"denials_not_logged":%d`, 1000-DenyLogsPerSecond)) ||
		strings.Contains(got[1], "denials_not_logged") {
		t.Errorf("half a second later: %d lines, first %q; want %d, the first counting the %d not logged",
			len(got), got[0], DenyLogsPerSecond/2, 1000-DenyLogsPerSecond)
	}
}

// A check no rule applies to is allowed and counted, as source no_rule
// with no rule: callers whose checks match nothing show in the metrics.
// A domain the rules do not name counts as "", so callers' made-up domains
// add no series.
func TestChecksNoRuleAppliesToAreCounted(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	m, err := newEngineMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	e := &Engine{log: slog.New(slog.DiscardHandler), m: m}
	e.SetRules(compile(t, `
domains:
  api:
    rules:
      - {name: per-user, key: [user], algorithm: fixed_window, limit: 10, window: 1m, failure_mode: open}
`))
	ctx := context.Background()
	for _, domain := range []string{"api", "api", "made-up-1", "made-up-2"} {
		if got := e.Check(ctx, domain, map[string]string{"other": "x"}, 1); !got.Allowed || got.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_NO_RULE {
			t.Fatalf("%s: %v, want allowed by no rule", domain, got)
		}
	}
	if got := e.CheckMany(ctx, []Request{{Domain: "made-up-3", Cost: 1}}); got[0].Source != ratelimitv1.DecisionSource_DECISION_SOURCE_NO_RULE {
		t.Fatalf("CheckMany: %v, want no rule", got[0])
	}
	// Every decision here is one of no rule.
	for domain, want := range map[string]int64{"api": 2, "": 3} {
		if got := metrictest.Counter(t, reader, "kurz.ratelimit.decisions", "domain", domain); got != want {
			t.Errorf("no_rule decisions of domain %q: %d, want %d", domain, got, want)
		}
	}
}

// A decision that answers by its rules' failure modes says why: the
// fallbacks counter by cause, and a WARN line naming the cause and the
// error, at most one a second per rule, the next saying how many were not
// logged. Before, every cause read as "quota denied ... source:
// fail_closed", the error at DEBUG only.
func TestAFallbackSaysWhy(t *testing.T) {
	var b strings.Builder
	reader := sdkmetric.NewManualReader()
	m, err := newEngineMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	e := &Engine{log: slog.New(slog.NewJSONHandler(&b, nil)), m: m, fallbackLogs: denyLimiter{perSecond: FallbackLogsPerSecond}}
	now := time.Unix(1_800_000_000, 0)
	e.fallbackLogs.now = func() time.Time { return now }
	closed := ratelimitv1.FailureMode_FAILURE_MODE_CLOSED
	rules := []Applied{
		{Rule: &Rule{Domain: "api", Name: "per-key", FailureMode: closed, Limit: 10, Window: time.Hour}, Key: "rl:{t:acme}:api:per-key:acme:k1"},
		{Rule: &Rule{Domain: "api", Name: "per-tenant", FailureMode: closed, Limit: 10, Window: time.Hour}, Key: "rl:{t:acme}:api:per-tenant:acme"},
	}
	decide := func(err error) {
		results := make([]result, len(rules))
		e.fallback(&group{idx: []int{0, 1}, keys: []string{rules[0].Key, rules[1].Key}, err: err}, rules, results, 1, now)
		for i, r := range results {
			if r.allowed || r.source != ratelimitv1.DecisionSource_DECISION_SOURCE_FAIL_CLOSED {
				t.Fatalf("%s: allowed=%v source=%v, want denied, FAIL_CLOSED", rules[i].Rule.Name, r.allowed, r.source)
			}
		}
	}
	for range 3 {
		decide(scriptError("TRYAGAIN Multiple keys request during rehashing of slot"))
	}
	now = now.Add(time.Second)
	decide(fmt.Errorf("lease: %w", context.DeadlineExceeded))

	for cause, want := range map[string]int64{"tryagain": 6, "timeout": 2} {
		if got := metrictest.Counter(t, reader, "kurz.ratelimit.fallbacks", "cause", cause); got != want {
			t.Errorf("fallbacks of cause %s: %d, want %d", cause, got, want)
		}
	}
	type line struct {
		Level     string   `json:"level"`
		Msg       string   `json:"msg"`
		Domain    string   `json:"domain"`
		Rules     []string `json:"rules"`
		Key       string   `json:"key"`
		Cause     string   `json:"cause"`
		Err       string   `json:"err"`
		NotLogged int64    `json:"fallbacks_not_logged"`
	}
	var lines []line
	for s := range strings.Lines(b.String()) {
		var l line
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("log line %q: %v", s, err)
		}
		lines = append(lines, l)
	}
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2 (one a second per rule): %s", len(lines), b.String())
	}
	first, second := lines[0], lines[1]
	if first.Level != "WARN" || first.Cause != "tryagain" || !strings.HasPrefix(first.Err, "TRYAGAIN") ||
		first.Domain != "api" || fmt.Sprint(first.Rules) != "[per-key per-tenant]" || first.Key != rules[0].Key || first.NotLogged != 0 {
		t.Errorf("first line: %+v", first)
	}
	if second.Level != "WARN" || second.Cause != "timeout" || second.NotLogged != 2 {
		t.Errorf("second line: %+v, want cause timeout with 2 not logged", second)
	}
}

// The causes are a bounded set, each found through the wrapping the
// engine's calls add.
func TestFallbackCauses(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{errBreakerOpen, "breaker_open"},
		{fmt.Errorf("lease: %w", scriptError("TRYAGAIN Multiple keys request during rehashing of slot")), "tryagain"},
		{scriptError("CLUSTERDOWN The cluster is down"), "clusterdown"},
		{&net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}, "refused"},
		{&lateReply{err: context.DeadlineExceeded}, "timeout"},
		{&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, "timeout"},
		{scriptError("ERR Error running script"), "redis_error"},
		{errors.New("redis: pipelines closed"), "other"},
	} {
		if got := fallbackCause(c.err); got != c.want {
			t.Errorf("cause of %v: %s, want %s", c.err, got, c.want)
		}
	}
}
