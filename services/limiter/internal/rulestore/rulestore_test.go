//go:build integration

package rulestore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/testkit/pgtest"
	"kurz.dev/services/limiter/internal/ratelimit"
	"kurz.dev/services/limiter/internal/rulestore/migrations"
)

// isolated returns a pool whose connections live in a fresh schema, with the
// limiter's migrations applied there, dropped when the test ends.
func isolated(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return pgtest.Schema(t, "seedtest", func(ctx context.Context, pool *pgxpool.Pool) error {
		_, err := pgpool.Migrate(ctx, pool, "limiter", migrations.FS)
		return err
	})
}

func TestSeedAddsNewBootstrapRulesAndKeepsOperatorChanges(t *testing.T) {
	pool := isolated(t)
	ctx := context.Background()
	cfg, err := Parse([]byte(`
domains:
  api:
    rules:
      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
      - {name: b, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
plans:
  free: {api/a: {limit: 5}}
tenants: {acme: free}
`))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := Seed(ctx, pool, cfg); err != nil || n != 6 {
		t.Fatalf("first seed: wrote %d, err %v; want 6 (domain, 2 rules, plan, limit, tenant)", n, err)
	}
	if n, err := Seed(ctx, pool, cfg); err != nil || n != 0 {
		t.Fatalf("second seed: wrote %d, err %v; want 0", n, err)
	}
	// An operator deletes rule b and raises a's limit; the file gains rule c.
	if _, err := pool.Exec(ctx, `DELETE FROM rl_rules WHERE name = 'b'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE rl_rules SET spec = jsonb_set(spec, '{limit}', '99') WHERE name = 'a'`); err != nil {
		t.Fatal(err)
	}
	d := cfg.Domains["api"]
	d.Rules = append(d.Rules, ratelimit.RuleSpec{Name: "c", Key: []string{"ip"}, Algorithm: "fixed_window", Limit: 1, Window: "1s", FailureMode: "closed"})
	cfg.Domains["api"] = d
	if n, err := Seed(ctx, pool, cfg); err != nil || n != 1 {
		t.Fatalf("seed with a new rule: wrote %d, err %v; want 1", n, err)
	}

	got := load(t, pool)
	var names []string
	limits := map[string]int64{}
	for _, r := range got.Domains["api"].Rules {
		names = append(names, r.Name)
		limits[r.Name] = r.Limit
	}
	if fmt.Sprint(names) != "[a c]" || limits["a"] != 99 {
		t.Errorf("rules %v limits %v: want [a c] with a's limit 99 (deleted b stays deleted, edit kept)", names, limits)
	}
	if got.Tenants["acme"] != "free" || got.Plans["free"]["api/a"].Limit != 5 {
		t.Errorf("tenants %v plans %v", got.Tenants, got.Plans)
	}
	if _, err := ratelimit.Compile(got); err != nil {
		t.Errorf("loaded rules do not compile: %v", err)
	}
}

// A tenant plan added to the bootstrap file reaches a database seeded
// before it (the anonymous tenant's plan never did: tenant plans were
// written on an empty schema only), but not over a tenant the operator has
// put on a plan, nor back after the operator deleted it.
func TestSeedAddsNewBootstrapTenantPlansAndKeepsOperatorChanges(t *testing.T) {
	pool := seeded(t, `
domains:
  api: {rules: [{name: a, key: [tenant], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}]}
plans:
  free: {api/a: {limit: 5}}
  pro: {api/a: {limit: 50}}
`)
	execSQL(t, pool, `INSERT INTO rl_tenant_plans (tenant, plan) VALUES ('acme', 'pro')`)
	seed(t, pool, `
domains:
  api: {rules: [{name: a, key: [tenant], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}]}
plans:
  free: {api/a: {limit: 5}}
  pro: {api/a: {limit: 50}}
tenants: {anonymous: free, acme: free}
`)
	got := load(t, pool)
	if got.Tenants["anonymous"] != "free" || got.Tenants["acme"] != "pro" {
		t.Fatalf("tenants after a bootstrap that adds two: %v; want anonymous on free (new), acme kept on pro (the operator's)", got.Tenants)
	}
	execSQL(t, pool, `DELETE FROM rl_tenant_plans WHERE tenant = 'anonymous'`)
	seed(t, pool, `
domains:
  api: {rules: [{name: a, key: [tenant], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}]}
plans:
  free: {api/a: {limit: 5}}
  pro: {api/a: {limit: 50}}
tenants: {anonymous: free, acme: free}
`)
	if plan, ok := load(t, pool).Tenants["anonymous"]; ok {
		t.Errorf("a tenant plan the operator deleted came back on %q", plan)
	}
}

// seeded returns an isolated pool whose rule tables are seeded from the
// rules YAML.
func seeded(t *testing.T, rules string) *pgxpool.Pool {
	t.Helper()
	pool := isolated(t)
	seed(t, pool, rules)
	return pool
}

// loaded returns a source of pool that has loaded the rules once, as a
// running limiter's has.
func loaded(t *testing.T, pool *pgxpool.Pool) *PostgresSource {
	t.Helper()
	src := &PostgresSource{Pool: pool}
	if _, err := src.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	return src
}

// seed seeds pool's rule tables from the rules YAML.
func seed(t *testing.T, pool *pgxpool.Pool, rules string) {
	t.Helper()
	cfg, err := Parse([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Seed(context.Background(), pool, cfg); err != nil {
		t.Fatal(err)
	}
}

// execSQL runs each statement on pool, as an operator's edits would.
func execSQL(t *testing.T, pool *pgxpool.Pool, statements ...string) {
	t.Helper()
	for _, sql := range statements {
		if _, err := pool.Exec(context.Background(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// load reads the rules back from pool as a limiter does.
func load(t *testing.T, pool *pgxpool.Pool) ratelimit.Config {
	t.Helper()
	got, err := (&PostgresSource{Pool: pool}).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A plan limit whose rule was deleted (or renamed) with SQL is left out of
// the rules, not a reason to refuse them all: plan changes keep applying,
// and a limiter can still start.
func TestPlanLimitOfADeletedRuleIsLeftOut(t *testing.T) {
	ctx := context.Background()
	pool := seeded(t, `
domains:
  api:
    rules:
      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
      - {name: b, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
plans:
  free: {api/a: {limit: 5}, api/b: {limit: 4}}
  pro: {}
tenants: {acme: pro}
`)
	if _, err := pool.Exec(ctx, `DELETE FROM rl_rules WHERE name = 'b'`); err != nil {
		t.Fatal(err)
	}
	if err := SetTenantPlan(ctx, pool, "acme", "free"); err != nil {
		t.Fatal(err)
	}
	got := load(t, pool)
	if _, ok := got.Plans["free"]["api/b"]; ok || got.Plans["free"]["api/a"].Limit != 5 {
		t.Errorf("plan free loaded as %v; want api/a's limit and no api/b", got.Plans["free"])
	}
	rs, err := ratelimit.Compile(got)
	if err != nil {
		t.Fatalf("rules with a deleted rule's plan limit do not compile: %v", err)
	}
	_, applied := rs.Match("api", map[string]string{"tenant": "acme", "ip": "192.0.2.1"})
	if len(applied) != 1 || applied[0].Plan != "free" || applied[0].Rule.Limit != 5 {
		t.Errorf("rules applied to acme after its move to free: %+v; want api/a with free's limit 5", applied)
	}
}

// A rule row or plan limit that does not compile neither stops a limiter
// from starting (the rest load, the row left out) nor holds back other
// changes on a running one (the row held at its last good version).
func TestRowThatDoesNotCompileIsHeldOrLeftOut(t *testing.T) {
	ctx := context.Background()
	pool := seeded(t, `
domains:
  api:
    rules:
      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
      - {name: b, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
plans:
  free: {api/a: {limit: 5}, api/b: {limit: 4}}
  pro: {}
tenants: {acme: pro}
`)
	running := loaded(t, pool)
	execSQL(t, pool, `UPDATE rl_rules SET spec = jsonb_set(spec, '{limit}', '2000000000000000') WHERE name = 'b'`)
	execSQL(t, pool, `UPDATE rl_plan_limits SET spec = jsonb_set(spec, '{window}', '"soon"') WHERE rule_id = 'api/a'`)
	execSQL(t, pool, `INSERT INTO rl_plan_limits (plan, rule_id, spec) VALUES ('pro', 'api/a', '{"limit": 50}')`)
	if err := SetTenantPlan(ctx, pool, "acme", "free"); err != nil {
		t.Fatal(err)
	}

	// A running limiter: the other changes apply, the bad rows stay as
	// they were.
	got, err := running.Load(ctx)
	var partial *PartialError
	if !errors.As(err, &partial) || len(partial.Problems) != 2 || !strings.Contains(err.Error(), "rule api/b held at its last good version") ||
		!strings.Contains(err.Error(), "plan free limit of api/a held") {
		t.Fatalf("Load after bad edits: %v; want a PartialError naming the two rows, held", err)
	}
	rs, err := ratelimit.Compile(got)
	if err != nil {
		t.Fatalf("what a partial Load returns does not compile: %v", err)
	}
	_, applied := rs.Match("api", map[string]string{"tenant": "acme", "ip": "192.0.2.1"})
	if len(applied) != 2 || applied[0].Rule.Limit != 5 || applied[1].Rule.Limit != 4 || applied[0].Plan != "free" {
		t.Errorf("acme after its move to free: %+v; want api/a at 5 and api/b at 4 (free's, on the held rule)", applied)
	}
	if got.Plans["pro"]["api/a"].Limit != 50 {
		t.Errorf("the new pro limit did not apply: %v", got.Plans["pro"])
	}

	// A limiter starting now has no last good version: the bad rule and
	// its plan limits are left out, the rest load.
	got, err = (&PostgresSource{Pool: pool}).Load(ctx)
	if !errors.As(err, &partial) || !strings.Contains(err.Error(), "rule api/b left out") || !strings.Contains(err.Error(), "plan free limit of api/a left out") {
		t.Fatalf("Load at start: %v; want the rows left out", err)
	}
	if rs, err = ratelimit.Compile(got); err != nil {
		t.Fatalf("what a starting limiter loads does not compile: %v", err)
	}
	_, applied = rs.Match("api", map[string]string{"tenant": "acme", "ip": "192.0.2.1"})
	if len(applied) != 1 || applied[0].Rule.Name != "a" || applied[0].Rule.Limit != 10 {
		t.Errorf("a starting limiter's rules for acme: %+v; want api/a alone, at the rule's own 10", applied)
	}

	// Mended, it loads whole again.
	execSQL(t, pool, `UPDATE rl_rules SET spec = jsonb_set(spec, '{limit}', '20') WHERE name = 'b'`)
	execSQL(t, pool, `UPDATE rl_plan_limits SET spec = '{"limit": 6, "burst": 1000}' WHERE plan = 'free' AND rule_id = 'api/a'`)
	if _, err := running.Load(ctx); err != nil {
		t.Errorf("Load after the rows are mended: %v", err)
	}

	// A good edit of a rule that its held plan limit no longer fits: the
	// limit is left out, not held, so the edit and the rest apply.
	execSQL(t, pool, `UPDATE rl_rules SET spec = jsonb_set(spec, '{window}', '"7200h"') WHERE name = 'a'`)
	got, err = running.Load(ctx)
	if !errors.As(err, &partial) || !strings.Contains(err.Error(), "plan free limit of api/a left out") {
		t.Fatalf("Load after the rule outgrew its plan limit: %v; want that limit left out", err)
	}
	if _, err := ratelimit.Compile(got); err != nil {
		t.Fatalf("what it returns does not compile: %v", err)
	}
	if w := got.Domains["api"].Rules[0].Window; w != "7200h" {
		t.Errorf("the rule's edit did not apply: window %q", w)
	}
}

// A starting limiter does not drop a fail-closed rule it cannot compile:
// one the seeded rules file has is held at that version, another refuses
// the start, unless it is a shadow rule (which denies nothing); a running
// limiter holds its last good version of any.
func TestFailClosedRuleThatDoesNotCompileIsNeverDropped(t *testing.T) {
	ctx := context.Background()
	pool := seeded(t, `
domains:
  links.password.guesses:
    rules:
      - {name: per-ip-link, key: [ip, code], algorithm: sliding_log, limit: 5, window: 15m, failure_mode: closed}
  api:
    rules:
      - {name: guard, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: closed}
      - {name: trial, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: closed, shadow: true}
      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
`)
	running := loaded(t, pool)
	if _, err := pool.Exec(ctx, `UPDATE rl_rules SET spec = jsonb_set(spec, '{window}', '"15 m"') WHERE name = 'per-ip-link'`); err != nil {
		t.Fatal(err)
	}
	// The seeded file's version, not the built-in one: this deployment's
	// limit is 7 where bootstrap.yaml says 5.
	seeded, err := Parse([]byte(`
domains:
  links.password.guesses:
    rules:
      - {name: per-ip-link, key: [ip, code], algorithm: sliding_log, limit: 7, window: 15m, failure_mode: closed}
`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE rl_rules SET spec = jsonb_set(spec, '{window}', '"15 m"') WHERE name = 'trial'`); err != nil {
		t.Fatal(err)
	}
	got, err := (&PostgresSource{Pool: pool, Shipped: seeded}).Load(ctx)
	var partial *PartialError
	if !errors.As(err, &partial) || !strings.Contains(err.Error(), "rule links.password.guesses/per-ip-link held at the version of the rules file") ||
		!strings.Contains(err.Error(), "rule api/trial left out") {
		t.Fatalf("a starting Load with the shipped rule broken: %v", err)
	}
	rs, err := ratelimit.Compile(got)
	if err != nil {
		t.Fatal(err)
	}
	if _, applied := rs.Match("links.password.guesses", map[string]string{"ip": "192.0.2.1", "code": "abcd"}); len(applied) != 1 ||
		applied[0].Rule.FailureMode != ratelimitv1.FailureMode_FAILURE_MODE_CLOSED || applied[0].Rule.Limit != 7 {
		t.Errorf("password attempts are decided by %+v; want the seeded file's per-ip-link rule, limit 7", applied)
	}

	if _, err := pool.Exec(ctx, `UPDATE rl_rules SET spec = jsonb_set(spec, '{limit}', '0') WHERE name = 'guard'`); err != nil {
		t.Fatal(err)
	}
	_, err = (&PostgresSource{Pool: pool}).Load(ctx)
	if err == nil || errors.As(err, &partial) || !strings.Contains(err.Error(), "rule api/guard fails closed and does not compile") {
		t.Fatalf("a starting Load with a fail-closed rule broken: %v; want the start refused", err)
	}
	got, err = running.Load(ctx)
	if !errors.As(err, &partial) || !strings.Contains(err.Error(), "rule api/guard held at its last good version") {
		t.Fatalf("a running Load with a fail-closed rule broken: %v; want it held", err)
	}
	if n := len(got.Domains["api"].Rules); n != 3 {
		t.Errorf("a running limiter has %d api rules, want all three", n)
	}
}

// A sliding log stored with a limit over today's bound (valid before it)
// is held at the bound, its plan overrides too: the rules still load.
func TestSlidingLogOverTheBoundIsHeldAtIt(t *testing.T) {
	ctx := context.Background()
	pool := seeded(t, `
domains:
  api:
    rules:
      - {name: log, key: [ip], algorithm: sliding_log, limit: 10, window: 1h, failure_mode: open}
plans:
  big: {api/log: {limit: 20}}
`)
	if _, err := pool.Exec(ctx, `UPDATE rl_rules SET spec = jsonb_set(spec, '{limit}', '50000') WHERE name = 'log'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE rl_plan_limits SET spec = jsonb_set(spec, '{limit}', '900000') WHERE plan = 'big'`); err != nil {
		t.Fatal(err)
	}
	got := load(t, pool)
	if _, err := ratelimit.Compile(got); err != nil {
		t.Fatalf("rules with a sliding log over the bound do not compile: %v", err)
	}
	if l := got.Domains["api"].Rules[0].Limit; l != ratelimit.MaxSlidingLogLimit {
		t.Errorf("sliding log's limit loaded as %d, want %d", l, ratelimit.MaxSlidingLogLimit)
	}
	if l := got.Plans["big"]["api/log"].Limit; l != ratelimit.MaxSlidingLogLimit {
		t.Errorf("plan override loaded as %d, want %d", l, ratelimit.MaxSlidingLogLimit)
	}
}

// A rule's lease survives PostgreSQL (it is part of the rule's jsonb spec),
// and a misspelt lease field in a rule file is an error.
func TestLeaseRoundTripsThroughPostgres(t *testing.T) {
	pool := seeded(t, `
domains:
  hot:
    rules:
      - {name: a, key: [user], algorithm: token_bucket, limit: 100, window: 1m, failure_mode: open, lease: {size: 10, ttl: 2s}}
`)
	got := load(t, pool)
	rs, err := ratelimit.Compile(got)
	if err != nil {
		t.Fatal(err)
	}
	if l := rs.Rules("hot")[0].Lease; l != (ratelimit.Lease{Size: 10, TTL: 2 * time.Second}) {
		t.Errorf("lease loaded from postgres: %+v, want size 10, ttl 2s", l)
	}
	if _, err := Parse([]byte(`domains: {hot: {rules: [{name: a, key: [user], algorithm: token_bucket, limit: 1, window: 1m, failure_mode: open, lease: {size: 1, tll: 1s}}]}}`)); err == nil {
		t.Error("lease with a misspelt field: want an error")
	}
}

// A row whose spec does not even decode (a number out of range, a string
// for a list) is held or left out like one that does not compile, instead
// of failing every reload (and every limiter's start) while the other
// changes wait.
func TestRowThatDoesNotDecodeIsHeldOrLeftOut(t *testing.T) {
	ctx := context.Background()
	pool := seeded(t, `
domains:
  api:
    rules:
      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
      - {name: b, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
plans:
  free: {api/a: {limit: 5}}
  pro: {}
tenants: {acme: pro}
`)
	running := loaded(t, pool)
	execSQL(t, pool,
		`UPDATE rl_rules SET spec = jsonb_set(spec, '{key}', '"ip"') WHERE name = 'b'`,
		`UPDATE rl_plan_limits SET spec = '{"limit": 1e19}' WHERE plan = 'free' AND rule_id = 'api/a'`,
		`INSERT INTO rl_plans (plan) VALUES ('odd')`,
		`INSERT INTO rl_plan_limits (plan, rule_id, spec) VALUES ('odd', 'api/a', '{"limit": "60"}')`,
	)
	if err := SetTenantPlan(ctx, pool, "acme", "free"); err != nil {
		t.Fatal(err)
	}
	got, err := running.Load(ctx)
	var partial *PartialError
	if !errors.As(err, &partial) || len(partial.Problems) != 3 || !strings.Contains(err.Error(), "rule api/b held at its last good version") ||
		!strings.Contains(err.Error(), "plan free limit of api/a held") || !strings.Contains(err.Error(), "plan odd limit of api/a left out") {
		t.Fatalf("Load after rows that do not decode: %v; want a PartialError naming the three rows", err)
	}
	rs, err := ratelimit.Compile(got)
	if err != nil {
		t.Fatalf("what a partial Load returns does not compile: %v", err)
	}
	if _, applied := rs.Match("api", map[string]string{"tenant": "acme", "ip": "192.0.2.1"}); len(applied) != 2 || applied[0].Plan != "free" || applied[0].Rule.Limit != 5 {
		t.Errorf("acme after its move to free: %+v; want api/a at free's 5 (held), and api/b", applied)
	}
	if got, err := (&PostgresSource{Pool: pool}).Load(ctx); !errors.As(err, &partial) || !strings.Contains(err.Error(), "rule api/b left out") {
		t.Errorf("a starting limiter: %v; want it to start with api/b left out", err)
	} else if _, err := ratelimit.Compile(got); err != nil {
		t.Errorf("what a starting limiter loads does not compile: %v", err)
	}
}

// A rule is its row's name: a row copied under another name is a rule of
// its own (not "defined twice", which stopped every reload), and renaming
// the column renames the rule.
func TestARuleIsItsRowsName(t *testing.T) {
	ctx := context.Background()
	pool := seeded(t, `
domains:
  api:
    rules:
      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
`)
	execSQL(t, pool,
		`INSERT INTO rl_rules (domain, name, position, spec) SELECT domain, 'a-strict', position + 10, spec || '{"limit": 5, "burst": 5}' FROM rl_rules WHERE name = 'a'`,
		`UPDATE rl_rules SET name = 'a-loose' WHERE name = 'a'`,
	)
	got, err := (&PostgresSource{Pool: pool}).Load(ctx)
	if err != nil {
		t.Fatalf("Load with a copied and a renamed row: %v", err)
	}
	var names []string
	for _, r := range got.Domains["api"].Rules {
		names = append(names, fmt.Sprintf("%s=%d", r.Name, r.Limit))
	}
	if strings.Join(names, " ") != "a-loose=10 a-strict=5" {
		t.Errorf("rules %v; want a-loose=10 a-strict=5", names)
	}
}

// countingSource records which loads a Refresher asks of a PostgresSource.
type countingSource struct {
	*PostgresSource
	mu    sync.Mutex
	calls []string
}

func (c *countingSource) record(call string) {
	c.mu.Lock()
	c.calls = append(c.calls, call)
	c.mu.Unlock()
}

func (c *countingSource) taken() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	calls := c.calls
	c.calls = nil
	return calls
}

func (c *countingSource) Load(ctx context.Context) (ratelimit.Config, error) {
	c.record("all")
	return c.PostgresSource.Load(ctx)
}

func (c *countingSource) LoadRules(ctx context.Context) (ratelimit.Config, error) {
	c.record("rules")
	return c.PostgresSource.LoadRules(ctx)
}

func (c *countingSource) LoadTenants(ctx context.Context, tenants []string) (map[string]string, error) {
	slices.Sort(tenants)
	c.record("tenants " + strings.Join(tenants, ","))
	return c.PostgresSource.LoadTenants(ctx, tenants)
}

// A notification naming tenants reloads only their plans, with the rules
// in force; one naming a rule table reloads the rules and keeps the
// tenants; "rl_tenant_plans" alone reloads everything.
func TestRefresherReloadsOnlyWhatChanged(t *testing.T) {
	pool := isolated(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seed(t, pool, `
domains:
  api:
    rules:
      - {name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 10, window: 1m, failure_mode: open}
plans:
  free: {}
  pro: {api/per-tenant: {limit: 1000}}
tenants: {t1: free, t2: free, t3: pro}
`)
	src := &countingSource{PostgresSource: &PostgresSource{Pool: pool}}
	applied := make(chan *ratelimit.Ruleset, 10)
	r := &Refresher{Source: src, Interval: time.Hour, Log: slog.New(slog.DiscardHandler),
		Apply: func(rs *ratelimit.Ruleset) { applied <- rs }}
	changes := NewChanges()
	go r.Run(ctx, changes)
	next := func(step string) *ratelimit.Ruleset {
		t.Helper()
		select {
		case rs := <-applied:
			return rs
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no rules applied within 5 s", step)
			return nil
		}
	}
	plans := func(rs *ratelimit.Ruleset, tenants ...string) string {
		var out []string
		for _, tenant := range tenants {
			out = append(out, tenant+"="+rs.Tenants().Plan(tenant))
		}
		return strings.Join(out, " ")
	}

	changes.Everything() // as Listen does when it connects
	rs := next("connect")
	if got, calls := plans(rs, "t1", "t2", "t3"), src.taken(); got != "t1=free t2=free t3=pro" || !slices.Equal(calls, []string{"all"}) {
		t.Fatalf("first refresh: %s after loads %q; want t1=free t2=free t3=pro after [all]", got, calls)
	}

	// One tenant a step: Run may wake between two notes.
	execSQL(t, pool, `UPDATE rl_tenant_plans SET plan = 'pro' WHERE tenant = 't1'`)
	changes.Note("rl_tenant_plans:t1")
	rs = next("t1 named")
	if got, calls := plans(rs, "t1", "t2", "t3"), src.taken(); got != "t1=pro t2=free t3=pro" || !slices.Equal(calls, []string{"tenants t1"}) {
		t.Errorf("after naming t1: %s after loads %q; want t1=pro t2=free t3=pro after [tenants t1]", got, calls)
	}
	execSQL(t, pool, `DELETE FROM rl_tenant_plans WHERE tenant = 't2'`)
	changes.Note("rl_tenant_plans:t2")
	rs = next("t2 named")
	if got, calls := plans(rs, "t1", "t2", "t3"), src.taken(); got != "t1=pro t2= t3=pro" || !slices.Equal(calls, []string{"tenants t2"}) {
		t.Errorf("after naming t2: %s after loads %q; want t1=pro t2= t3=pro after [tenants t2]", got, calls)
	}
	if _, applied := rs.Match("api", map[string]string{"tenant": "t1"}); len(applied) != 1 || applied[0].Rule.Limit != 1000 || applied[0].Plan != "pro" {
		t.Errorf("t1's request after its plan change: %+v, want the pro plan's limit 1000", applied)
	}

	// A plan created with its first tenant: the rules are reloaded too.
	execSQL(t, pool,
		`INSERT INTO rl_plans (plan) VALUES ('team')`,
		`INSERT INTO rl_plan_limits (plan, rule_id, spec) VALUES ('team', 'api/per-tenant', '{"limit": 50}')`,
		`INSERT INTO rl_tenant_plans (tenant, plan) VALUES ('t4', 'team')`)
	changes.Note("rl_tenant_plans:t4")
	rs = next("tenant on a new plan")
	if got, calls := plans(rs, "t1", "t4"), src.taken(); got != "t1=pro t4=team" || !slices.Equal(calls, []string{"tenants t4", "rules"}) {
		t.Errorf("after naming t4 on a new plan: %s after loads %q; want t1=pro t4=team after [tenants t4, rules]", got, calls)
	}
	if _, applied := rs.Match("api", map[string]string{"tenant": "t4"}); len(applied) != 1 || applied[0].Rule.Limit != 50 {
		t.Errorf("t4's request on the new plan: %+v, want its limit 50", applied)
	}

	execSQL(t, pool, `UPDATE rl_plan_limits SET spec = '{"limit": 2000}' WHERE plan = 'pro'`)
	changes.Note("rl_plan_limits")
	rs = next("plan limits")
	if got, calls := plans(rs, "t1", "t2", "t3", "t4"), src.taken(); got != "t1=pro t2= t3=pro t4=team" || !slices.Equal(calls, []string{"rules"}) {
		t.Errorf("after a plan limit change: %s after loads %q; want the tenants kept after [rules]", got, calls)
	}
	if _, applied := rs.Match("api", map[string]string{"tenant": "t3"}); len(applied) != 1 || applied[0].Rule.Limit != 2000 {
		t.Errorf("t3's request after the pro plan's change: %+v, want its limit 2000", applied)
	}

	execSQL(t, pool, `INSERT INTO rl_tenant_plans (tenant, plan) VALUES ('t2', 'free')`)
	changes.Note("rl_tenant_plans")
	rs = next("every tenant")
	if got, calls := plans(rs, "t1", "t2"), src.taken(); got != "t1=pro t2=free" || !slices.Equal(calls, []string{"all"}) {
		t.Errorf("after rl_tenant_plans alone: %s after loads %q; want t1=pro t2=free after [all]", got, calls)
	}
}

// The tenant table's triggers name each tenant a statement changes (both
// names of a renamed one), or none past 100.
func TestTenantPlanChangesNameTheirTenants(t *testing.T) {
	ctx := context.Background()
	pool := seeded(t, `
domains:
  api:
    rules:
      - {name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 10, window: 1m, failure_mode: open}
plans: {free: {}, pro: {}}
`)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+Channel); err != nil {
		t.Fatal(err)
	}
	// Other tests' schemas notify on the same channel: ours are told apart
	// by a prefix of our own.
	p := fmt.Sprintf("n%d-", time.Now().UnixNano())
	heard := func(step string, want ...string) {
		t.Helper()
		var got []string
		wait, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		for len(got) < len(want) {
			n, err := conn.Conn().WaitForNotification(wait)
			if err != nil {
				t.Fatalf("%s: heard %q, want %q: %v", step, got, want, err)
			}
			if tenant, ok := strings.CutPrefix(n.Payload, "rl_tenant_plans:"); ok && strings.HasPrefix(tenant, p) {
				got = append(got, strings.TrimPrefix(tenant, p))
			} else if n.Payload == "rl_tenant_plans" && slices.Contains(want, "*") {
				got = append(got, "*")
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: heard %q, want %q", step, got, want)
		}
	}
	q := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, strings.ReplaceAll(sql, "P-", p)); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	q(`INSERT INTO rl_tenant_plans VALUES ('P-a', 'free'), ('P-b', 'free')`)
	heard("insert", "a", "b")
	q(`INSERT INTO rl_tenant_plans VALUES ('P-a', 'pro'), ('P-c', 'pro') ON CONFLICT (tenant) DO UPDATE SET plan = EXCLUDED.plan`)
	heard("upsert", "a", "c")
	q(`UPDATE rl_tenant_plans SET tenant = 'P-z' WHERE tenant = 'P-b'`)
	heard("rename", "b", "z")
	q(`DELETE FROM rl_tenant_plans WHERE tenant = 'P-c'`)
	heard("delete", "c")
	q(`INSERT INTO rl_tenant_plans SELECT 'P-bulk' || g, 'free' FROM generate_series(1, 101) g`)
	heard("101 tenants", "*")
	q(`INSERT INTO rl_tenant_plans VALUES ('P-` + strings.Repeat("x", 1001) + `', 'free')`)
	heard("a tenant ID over 1,000 bytes", "*")
}

// A domain whose defaults do not decode is held at its last good defaults
// (or goes without), like a rule row: one bad row must not stop every
// reload, nor a limiter's start.
func TestDomainDefaultsThatDoNotDecodeAreHeld(t *testing.T) {
	ctx := context.Background()
	pool := seeded(t, `
domains:
  zz:
    defaults: {tier: basic}
    rules:
      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
  other:
    rules:
      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
plans: {free: {}, pro: {}}
tenants: {acme: pro}
`)
	running := loaded(t, pool)
	execSQL(t, pool, `UPDATE rl_domains SET defaults = '{"tier": 1}' WHERE domain = 'zz'`)
	if err := SetTenantPlan(ctx, pool, "acme", "free"); err != nil {
		t.Fatal(err)
	}
	got, err := running.Load(ctx)
	var partial *PartialError
	if !errors.As(err, &partial) || len(partial.Problems) != 1 || !strings.Contains(err.Error(), "domain zz held at its last good defaults") {
		t.Fatalf("Load after defaults that do not decode: %v; want a PartialError naming domain zz, held", err)
	}
	if got.Domains["zz"].Defaults["tier"] != "basic" || got.Tenants["acme"] != "free" || len(got.Domains["other"].Rules) != 1 {
		t.Errorf("after the bad defaults: zz defaults %v, acme on %q, other's rules %d; want tier basic, free, 1", got.Domains["zz"].Defaults, got.Tenants["acme"], len(got.Domains["other"].Rules))
	}
	fresh, err := (&PostgresSource{Pool: pool}).Load(ctx)
	if !errors.As(err, &partial) || !strings.Contains(err.Error(), "domain zz without defaults") {
		t.Fatalf("a starting limiter: %v; want it to start, zz without defaults", err)
	}
	if _, err := ratelimit.Compile(fresh); err != nil || len(fresh.Domains["zz"].Rules) != 1 {
		t.Errorf("a starting limiter's rules: compile %v, zz rules %d; want them compiled with zz's rule", err, len(fresh.Domains["zz"].Rules))
	}
}

// A stored plan limit of 0 is refused like a row that does not compile:
// held at its last good version, else left out, and reported.
func TestStoredPlanFigureOfZeroIsHeld(t *testing.T) {
	ctx := context.Background()
	pool := seeded(t, `
domains:
  api:
    rules:
      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
plans:
  free: {api/a: {limit: 5}}
  pro: {}
`)
	running := loaded(t, pool)
	execSQL(t, pool,
		`UPDATE rl_plan_limits SET spec = '{"Limit": 0}' WHERE plan = 'free'`,
		`INSERT INTO rl_plan_limits (plan, rule_id, spec) VALUES ('pro', 'api/a', '{"burst": 0.5, "window": "1m"}')`)
	got, err := running.Load(ctx)
	var partial *PartialError
	if !errors.As(err, &partial) || len(partial.Problems) != 2 ||
		!strings.Contains(err.Error(), "plan free limit of api/a held at its last good version (limit 0 would keep the rule's own limit") ||
		!strings.Contains(err.Error(), "plan pro limit of api/a left out (its spec does not decode: json: cannot unmarshal number 0.5") {
		t.Fatalf("Load after plan figures of 0 and 0.5: %v; want both refused, free's held and pro's left out", err)
	}
	if l := got.Plans["free"]["api/a"].Limit; l != 5 {
		t.Errorf("free's limit of api/a after a stored 0: %d, want 5 (held)", l)
	}
	if _, ok := got.Plans["pro"]["api/a"]; ok {
		t.Errorf("pro's limit of api/a with a stored burst of 0 is in force; want it left out")
	}
}

// A row with a misspelt field is refused like one that does not compile:
// held at its last good version, reported by the refresh (counted as
// failed, and logged) with the row and the field named. It used to be
// applied without the field: a "mach" made a rule limit every request of
// its domain, a "brust" or "limt" kept the rule's own figure.
func TestRowWithAnUnknownFieldIsHeld(t *testing.T) {
	ctx := context.Background()
	pool := seeded(t, `
domains:
  api:
    rules:
      - {name: a, key: [ip], match: {route: login}, algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
      - {name: b, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
plans:
  free: {api/b: {limit: 5}}
`)
	var results []error
	var applied *ratelimit.Ruleset
	r := &Refresher{Source: loaded(t, pool), Interval: time.Hour, Log: slog.New(slog.DiscardHandler),
		Apply: func(rs *ratelimit.Ruleset) { applied = rs }, OnResult: func(err error) { results = append(results, err) }}
	execSQL(t, pool,
		`UPDATE rl_rules SET spec = spec - 'match' || '{"mach": {"route": "login"}}' WHERE name = 'a'`,
		`UPDATE rl_rules SET spec = spec || '{"brust": 2}' WHERE name = 'b'`,
		`UPDATE rl_plan_limits SET spec = '{"limt": 1}' WHERE plan = 'free'`,
	)
	err := r.Refresh(ctx)
	var partial *PartialError
	if !errors.As(err, &partial) || len(results) != 1 || results[0] != err {
		t.Fatalf("refresh after misspelt fields: %v (observed %v); want a PartialError, counted", err, results)
	}
	for _, want := range []string{
		`rule api/a held at its last good version (its spec does not decode: json: unknown field "mach")`,
		`rule api/b held at its last good version (its spec does not decode: json: unknown field "brust")`,
		`plan free limit of api/b held at its last good version (its spec does not decode: json: unknown field "limt")`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refresh error %q does not say %q", err, want)
		}
	}
	if _, rules := applied.Match("api", map[string]string{"ip": "192.0.2.1", "route": "home"}); len(rules) != 1 || rules[0].Rule.Name != "b" {
		t.Errorf("rules applied to route home: %d; want b alone (a held at its match)", len(rules))
	}
}

// A window or lease ttl that is not a whole number of milliseconds (the
// scripts' unit) is a row that does not compile: held, not cut to 1ms.
func TestRowWithASubMillisecondWindowIsHeld(t *testing.T) {
	pool := seeded(t, `
domains:
  api:
    rules:
      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
plans:
  free: {api/a: {limit: 5}}
`)
	running := loaded(t, pool)
	execSQL(t, pool,
		`UPDATE rl_rules SET spec = spec || '{"window": "1500us"}' WHERE name = 'a'`,
		`UPDATE rl_plan_limits SET spec = '{"window": "2500us"}' WHERE plan = 'free'`)
	got, err := running.Load(context.Background())
	var partial *PartialError
	if !errors.As(err, &partial) || !strings.Contains(err.Error(), "rule api/a held at its last good version (rule api/a: window 1.5ms: want a whole number of milliseconds)") ||
		!strings.Contains(err.Error(), "plan free limit of api/a held at its last good version") {
		t.Fatalf("Load after sub-millisecond windows: %v; want both rows held, named", err)
	}
	if w := got.Domains["api"].Rules[0].Window; w != "1s" {
		t.Errorf("api/a's window in force: %q, want 1s (held)", w)
	}
}

// A rule the bootstrap file adds to a domain an operator deleted, or a
// limit or tenant it adds to a deleted plan, is skipped: written, it
// would fail the tables' foreign keys, the seed, and every limiter's
// start.
func TestSeedSkipsItemsOfADeletedDomainOrPlan(t *testing.T) {
	pool := seeded(t, `
domains:
  api:
    rules:
      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
plans:
  team: {api/a: {limit: 5}}
`)
	execSQL(t, pool, `DELETE FROM rl_domains WHERE domain = 'api'`, `DELETE FROM rl_plans WHERE plan = 'team'`)
	cfg, err := Parse([]byte(`
domains:
  api:
    rules:
      - {name: a, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
      - {name: b, key: [ip], algorithm: token_bucket, limit: 10, window: 1s, failure_mode: open}
plans:
  team: {api/a: {limit: 5}, api/b: {limit: 5}}
tenants: {acme: team}
`))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := Seed(context.Background(), pool, cfg); err != nil || n != 0 {
		t.Fatalf("seed of new items of a deleted domain and plan: wrote %d, %v; want them skipped", n, err)
	}
}
