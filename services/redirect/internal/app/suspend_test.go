//go:build integration

package app

import (
	"context"
	"crypto/rand"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/servertest"
)

// A tenant the gateway suspends (a row of tenant_suspensions) stops
// redirecting on every replica within the refresh bound, from L1 too,
// answering 410 like a disabled link; another tenant's links redirect
// throughout; the resume (the row deleted) brings the redirect back within
// the same bound. The replicas use the default refresh (2s): the bound
// documented is that plus one read, within 5s.
func TestSuspendedTenantStopsRedirectingOnEveryReplica(t *testing.T) {
	f := newFixture(t)
	replicas := []instance{start(t, nil, hooks{}), start(t, nil, hooks{})}
	bound := replicas[0].cfg.SuspensionRefresh + replicas[0].cfg.Postgres.QueryTimeout
	if bound > 5*time.Second {
		t.Fatalf("the default refresh (%s) plus a read (%s) is over the 5s promised", replicas[0].cfg.SuspensionRefresh, replicas[0].cfg.Postgres.QueryTimeout)
	}
	abuser, other := "abuser-"+strings.ToLower(rand.Text()[:8]), "other-"+strings.ToLower(rand.Text()[:8])
	phish, fine := f.code(), f.code()
	f.insert(phish, abuser, "https://example.com/phish", 302, nil, false)
	f.insert(fine, other, "https://example.com/fine", 302, nil, false)
	ctx := context.Background()
	t.Cleanup(func() {
		_, _ = f.db.Exec(context.Background(), `DELETE FROM tenant_suspensions WHERE tenant = $1`, abuser)
	})
	status := func(r instance, code string) int { return get(t, r.HTTP, "/"+code).StatusCode }
	for _, r := range replicas {
		for range 2 { // into L1
			if s, s2 := status(r, phish), status(r, fine); s != http.StatusFound || s2 != http.StatusFound {
				t.Fatalf("before the suspension: %d, %d; want 302", s, s2)
			}
		}
	}

	// What the gateway's suspend writes here (keystore.Suspend).
	if _, err := f.db.Exec(ctx, `INSERT INTO tenant_suspensions (tenant) VALUES ($1)`, abuser); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i, r := range replicas {
		if !servertest.Eventually(bound, func() bool { return status(r, phish) == http.StatusGone }) {
			t.Fatalf("replica %d: the suspended tenant's link still answers %d after %s", i, status(r, phish), time.Since(start))
		}
		resp := get(t, r.HTTP, "/"+phish)
		if resp.Header.Get("X-Source") != "l1" || !strings.Contains(resp.Header.Get("X-Test-Body"), "no longer available") {
			t.Errorf("replica %d: the suspended link answers from %q: %q; want L1's entry and the disabled link's page",
				i, resp.Header.Get("X-Source"), resp.Header.Get("X-Test-Body"))
		}
		if s := status(r, fine); s != http.StatusFound {
			t.Errorf("replica %d: another tenant's link while one is suspended: %d, want 302", i, s)
		}
		if code, body := r.GetOps(t, "/readyz"); code != http.StatusOK {
			t.Errorf("replica %d: /readyz %d: %s", i, code, body)
		}
	}
	t.Logf("suspended everywhere after %s (bound %s)", time.Since(start), bound)

	if _, err := f.db.Exec(ctx, `DELETE FROM tenant_suspensions WHERE tenant = $1`, abuser); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	for i, r := range replicas {
		if !servertest.Eventually(bound, func() bool { return status(r, phish) == http.StatusFound }) {
			t.Fatalf("replica %d: the resumed tenant's link still answers %d after %s", i, status(r, phish), time.Since(start))
		}
	}
}

// failSuspensionReads fails every read of the suspended tenants, as a
// database without tenant_suspensions (a shortener not yet upgraded) would.
type failSuspensionReads struct{}

func (failSuspensionReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(d.SQL, "FROM tenant_suspensions") {
		return ctx
	}
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	return ctx
}

func (failSuspensionReads) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Until the suspended tenants were read once the replica cannot tell a
// suspended tenant's links: it is not ready, naming tenant_suspensions, so
// a replica started during an abuse takes no traffic before it knows.
func TestNotReadyBeforeTheSuspensionsWereRead(t *testing.T) {
	newFixture(t)
	cfg := load(t, map[string]string{"KURZ_REDIRECT_VISITOR_SALT": testSalt,
		"KURZ_LIMITER_GRPC_ADDR": limitertest.Start(t, limitertest.AllowAll).Addr(),
	})
	srv, err := build(context.Background(), cfg, servertest.Logger(t), hooks{pgTracer: failSuspensionReads{}})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	redir := servertest.Start(t, srv)
	if status, body := redir.AwaitReadyz(t); status == http.StatusOK || !strings.Contains(body, "tenant_suspensions") {
		t.Errorf("/readyz before the suspensions were read: %d %s, want not ready, naming tenant_suspensions", status, body)
	}
}

// failSuspensionReadsWhile fails the reads of the suspended tenants while
// failing is set, as a lost table, a revoked grant or a broken connection
// pool would after the replica became ready.
type failSuspensionReadsWhile struct{ failing atomic.Bool }

func (f *failSuspensionReadsWhile) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !f.failing.Load() {
		return ctx
	}
	return failSuspensionReads{}.TraceQueryStart(ctx, c, d)
}

func (*failSuspensionReadsWhile) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A replica whose reads of the suspended tenants fail after it became
// ready keeps serving on the set it has and stays ready (every replica
// would fail them alike in a PostgreSQL outage), but says so:
// kurz_redirect_set_age_seconds{set="tenant_suspensions"} grows past its
// refresh (kurz_redirect_set_refresh_seconds) while the custom domains',
// still read, stays within theirs; a read that succeeds again brings the
// age back down.
func TestAStaleSuspensionSetShowsItsAge(t *testing.T) {
	newFixture(t)
	reads := &failSuspensionReadsWhile{}
	r := start(t, map[string]string{
		"KURZ_REDIRECT_SUSPENSION_REFRESH": "100ms",
		"KURZ_REDIRECT_DOMAIN_REFRESH":     "100ms",
	}, hooks{pgTracer: reads})
	const suspensions, domains = `set="tenant_suspensions"`, `set="custom_domains"`
	for _, set := range []string{suspensions, domains} {
		if got := metricValue(t, r.Running, "kurz_redirect_set_refresh_seconds", set); got != 0.1 {
			t.Fatalf("kurz_redirect_set_refresh_seconds{%s} = %v, want the 100ms configured", set, got)
		}
	}
	const stale = time.Second // ten refreshes
	if age := metricValue(t, r.Running, "kurz_redirect_set_age_seconds", suspensions); age <= 0 || age >= stale.Seconds() {
		t.Fatalf("kurz_redirect_set_age_seconds{%s} = %v while the reads succeed, want under %s", suspensions, age, stale)
	}

	reads.failing.Store(true)
	await(t, "the suspended tenants' age past ten refreshes", 10*stale, func() bool {
		return metricValue(t, r.Running, "kurz_redirect_set_age_seconds", suspensions) > stale.Seconds()
	})
	if age := metricValue(t, r.Running, "kurz_redirect_set_age_seconds", domains); age <= 0 || age >= stale.Seconds() {
		t.Errorf("kurz_redirect_set_age_seconds{%s} = %v while only the suspensions' reads fail, want under %s", domains, age, stale)
	}
	if code, body := r.GetOps(t, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz on a stale suspension set: %d %s, want ready (serving through a PostgreSQL outage)", code, body)
	}

	reads.failing.Store(false)
	await(t, "the suspended tenants' age back under ten refreshes", 10*stale, func() bool {
		return metricValue(t, r.Running, "kurz_redirect_set_age_seconds", suspensions) < stale.Seconds()
	})
}
