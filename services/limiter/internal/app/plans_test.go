//go:build integration

package app

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/limiter/internal/rulestore"
)

// A tenant's plan change in PostgreSQL reaches the limiter through NOTIFY
// within a second (the periodic refresh is set to an hour, so nothing else
// could), and a plan with a smaller burst clamps the tokens a bucket already
// holds. Rules: the bootstrap's api/per-api-key, 600/min burst 100; plan
// free 60/min burst 20; plan pro 6000/min burst 1000.
func TestPlanChangeAppliesWithinASecond(t *testing.T) {
	ctx := context.Background()
	rl, db := startPostgres(t)
	u := unique(t)
	warmup, tenant := u+"-warmup", u+"-tenant"
	cleanTenants(t, db, warmup, tenant)

	peek := func(tenant, key string) *ratelimitv1.RuleDecision { return peekAPIKey(t, rl, tenant, key) }
	explain := func(tenant, key string) *ratelimitv1.RuleExplanation {
		t.Helper()
		resp, err := rl.ExplainQuota(ctx, &ratelimitv1.ExplainQuotaRequest{
			Domain: "api", Descriptors: map[string]string{"tenant": tenant, "api_key": key}, Cost: ptr(uint32(0)),
		})
		if err != nil {
			t.Fatalf("ExplainQuota: %v", err)
		}
		return explanationOf(t, resp, "per-api-key")
	}
	// setPlan commits the change and returns how long after the commit the
	// limiter first answered with limit want (or that it never did in 5 s).
	setPlan := func(tenant, plan, key string, want int64) (time.Duration, bool) {
		t.Helper()
		return setPlan(t, rl, db, tenant, plan, key, want)
	}

	// The LISTEN connection is set up in the background: see one change go
	// through (untimed) before timing the next ones.
	if _, ok := setPlan(warmup, "free", u+"-warmup-key", 60); !ok {
		t.Fatal("a plan change never reached the limiter (LISTEN/NOTIFY)")
	}

	key := u + "-key1"
	if d := peek(tenant, key); d.GetLimit() != 600 || d.GetRemaining() != 100 {
		t.Fatalf("without a plan: limit %d remaining %d, want the bootstrap's 600 and burst 100", d.GetLimit(), d.GetRemaining())
	}
	for _, step := range []struct {
		plan             string
		limit, remaining int64
	}{
		{"free", 60, 20},
		{"pro", 6000, 1000},
	} {
		took, ok := setPlan(tenant, step.plan, key, step.limit)
		if !ok || took > time.Second {
			t.Errorf("plan %s applied after %v (applied: %v), want within 1 s of the commit", step.plan, took, ok)
		}
		t.Logf("plan %s applied %v after the commit", step.plan, took)
		if d := peek(tenant, key); d.GetLimit() != step.limit || d.GetRemaining() != step.remaining {
			t.Errorf("on %s: limit %d remaining %d, want %d and %d", step.plan, d.GetLimit(), d.GetRemaining(), step.limit, step.remaining)
		}
		if e := explain(tenant, key); e.GetPlan() != step.plan || e.GetBurst() != step.remaining {
			t.Errorf("on %s: explain plan %q burst %d, want %q and %d", step.plan, e.GetPlan(), e.GetBurst(), step.plan, step.remaining)
		}
	}

	// Shrinking the burst clamps what a bucket holds: min(burst, tokens).
	key = u + "-key2"
	if d := peek(tenant, key); d.GetRemaining() != 1000 {
		t.Fatalf("fresh key on pro: %d left, want 1000", d.GetRemaining())
	}
	resp, err := rl.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: "api", Descriptors: map[string]string{"tenant": tenant, "api_key": key}})
	if err != nil || !resp.GetAllowed() {
		t.Fatalf("CheckQuota on pro: %v %v, want allowed", resp, err)
	}
	if tokens := storedTokens(t, explain(tenant, key)); tokens < 999 {
		t.Fatalf("stored tokens on pro after one request: %v, want >= 999", tokens)
	}
	took, ok := setPlan(tenant, "free", key, 60)
	if !ok || took > time.Second {
		t.Errorf("back to free applied after %v (applied: %v), want within 1 s of the commit", took, ok)
	}
	if d := peek(tenant, key); d.GetRemaining() > 20 {
		t.Errorf("after moving to free: %d left, want at most the new burst 20", d.GetRemaining())
	}
	resp, err = rl.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{Domain: "api", Descriptors: map[string]string{"tenant": tenant, "api_key": key}})
	if err != nil || !resp.GetAllowed() {
		t.Fatalf("CheckQuota on free: %v %v, want allowed", resp, err)
	}
	if d := decisionOf(t, resp, "per-api-key"); d.GetRemaining() != 19 {
		t.Errorf("first request on free: %d left, want 19 (clamped to 20, minus 1)", d.GetRemaining())
	}
	if tokens := storedTokens(t, explain(tenant, key)); tokens > 20 {
		t.Errorf("stored tokens on free: %v, want at most 20", tokens)
	}
}

// storedTokens reads the token bucket's raw state from an explanation.
func storedTokens(t *testing.T, e *ratelimitv1.RuleExplanation) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(e.GetState()["tokens"], 64)
	if err != nil {
		t.Fatalf("state %v: tokens: %v", e.GetState(), err)
	}
	return v
}

// A tenant throttled on its plan and moved to a bigger one is served by the
// new plan within a second, even though its last denial (cached in memory
// until its retry-after) was decided under the old one.
func TestPlanUpgradeLiftsAnEarlierDenial(t *testing.T) {
	ctx := context.Background()
	rl, db := startPostgres(t)
	u := unique(t)
	warmup, tenant, key := u+"-warmup", u+"-tenant", u+"-key"
	cleanTenants(t, db, warmup, tenant)
	if _, ok := setPlan(t, rl, db, warmup, "free", u+"-warmup-key", 60); !ok {
		t.Fatal("a plan change never reached the limiter (LISTEN/NOTIFY)")
	}
	if _, ok := setPlan(t, rl, db, tenant, "free", key, 60); !ok {
		t.Fatal("plan free never applied")
	}
	check := func() *ratelimitv1.CheckQuotaResponse {
		t.Helper()
		resp, err := rl.CheckQuota(ctx, &ratelimitv1.CheckQuotaRequest{
			Domain: "api", Descriptors: map[string]string{"tenant": tenant, "api_key": key}, Cost: ptr(uint32(20)),
		})
		if err != nil {
			t.Fatalf("CheckQuota: %v", err)
		}
		return resp
	}
	// Free: burst 20 at one token a second. 20 now, then 20 more is 20 s away.
	if resp := check(); !resp.GetAllowed() {
		t.Fatalf("first cost-20 request on free denied by %s, want allowed", resp.GetDecidingRule())
	}
	if resp := check(); resp.GetAllowed() || resp.GetRetryAfter().AsDuration() < 10*time.Second {
		t.Fatalf("second cost-20 request on free: allowed=%v retry_after=%v, want denied for ~20 s", resp.GetAllowed(), resp.GetRetryAfter().AsDuration())
	}
	// Pro: burst 1000 at 100 tokens a second; 20 tokens are back within
	// 0.2 s of the denial.
	took, ok := setPlan(t, rl, db, tenant, "pro", key, 6000)
	if !ok {
		t.Fatal("plan pro never applied")
	}
	committed := time.Now().Add(-took)
	var last *ratelimitv1.CheckQuotaResponse
	if !servertest.Eventually(time.Second, func() bool { last = check(); return last.GetAllowed() }) {
		t.Errorf("cost-20 request %v after moving to pro: still denied by %s (limit %d, retry_after %v), want allowed within 1 s of the commit",
			time.Since(committed), last.GetDecidingRule(), last.GetLimit(), last.GetRetryAfter().AsDuration())
	}
}

// startPostgres boots the limiter in-process with its rules in PostgreSQL
// (kurz_test under make test; migrated and seeded from the bootstrap file if
// empty), refreshed only by NOTIFY within the test's time, and returns a
// client and a pool on the same database.
func startPostgres(t *testing.T) (ratelimitv1.RateLimitServiceClient, *pgxpool.Pool) {
	t.Helper()
	r, db := startPostgresServer(t)
	return ratelimitv1.NewRateLimitServiceClient(r.Conn), db
}

// startPostgresServer is startPostgres's limiter itself.
func startPostgresServer(t *testing.T) (*servertest.Running, *pgxpool.Pool) {
	t.Helper()
	cfg := load(t, map[string]string{
		"KURZ_LIMITER_RULES_SOURCE":  "postgres",
		"KURZ_LIMITER_RULES_REFRESH": "1h",
		"KURZ_LIMITER_REDIS_TIMEOUT": "1s",
		"KURZ_REDIS_READ_TIMEOUT":    "1s",
		"KURZ_REDIS_WRITE_TIMEOUT":   "1s",
	})
	srv, err := New(context.Background(), cfg, servertest.Logger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "kurz.ratelimit.v1.RateLimitService")
	db, err := pgpool.New(context.Background(), cfg.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return r, db
}

// cleanTenants deletes the test's tenant plans when the test ends.
func cleanTenants(t *testing.T, db *pgxpool.Pool, tenants ...string) {
	t.Cleanup(func() {
		if _, err := db.Exec(context.Background(), `DELETE FROM rl_tenant_plans WHERE tenant = ANY($1)`, tenants); err != nil {
			t.Errorf("clean up rl_tenant_plans: %v", err)
		}
	})
}

// peekAPIKey looks at api/per-api-key for tenant and key without consuming.
func peekAPIKey(t *testing.T, rl ratelimitv1.RateLimitServiceClient, tenant, key string) *ratelimitv1.RuleDecision {
	t.Helper()
	resp, err := rl.CheckQuota(context.Background(), &ratelimitv1.CheckQuotaRequest{
		Domain: "api", Descriptors: map[string]string{"tenant": tenant, "api_key": key}, Cost: ptr(uint32(0)),
	})
	if err != nil {
		t.Fatalf("CheckQuota: %v", err)
	}
	return decisionOf(t, resp, "per-api-key")
}

// setPlan commits tenant's move to plan and returns how long after the
// commit the limiter first answered api/per-api-key with limit want, or
// false if it did not within 5 s.
func setPlan(t *testing.T, rl ratelimitv1.RateLimitServiceClient, db *pgxpool.Pool, tenant, plan, key string, want int64) (time.Duration, bool) {
	t.Helper()
	if err := rulestore.SetTenantPlan(context.Background(), db, tenant, plan); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	ok := servertest.Eventually(5*time.Second, func() bool { return peekAPIKey(t, rl, tenant, key).GetLimit() == want })
	return time.Since(committed), ok
}
