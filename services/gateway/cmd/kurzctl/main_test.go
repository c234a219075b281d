package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/server/servertest"
	"kurz.dev/services/gateway/internal/app"
)

// Health service names the tests wait for.
const (
	limiterService   = "kurz.ratelimit.v1.RateLimitService"
	shortenerService = "kurz.shortener.v1.ShortenerService"
	analyticsService = "kurz.analytics.v1.AnalyticsService"
)

// shortBase is the test shortener's short-link host: make up's, so the
// README's outputs read the same here and there.
const shortBase = "http://127.0.0.1:8787"

// adminToken is the test gateways' admin credential.
const adminToken = "test-admin-token-0123456789abcdef"

// runAsKurzctl, set in a process's environment, makes the test binary be
// kurzctl: the README test runs its examples with bash, through a
// "kurzctl" symlink to this binary, so they exercise the code under test.
const runAsKurzctl = "KURZCTL_TEST_RUN_AS_MAIN"

// stack is what TestMain starts once: two limiters (the gateway tests'
// roomy rules from a file; and the rules in PostgreSQL, as under make up,
// where tenant plans apply), the shortener and analytics, on the shared
// Redis, PostgreSQL (kurz_test) and ClickHouse.
var stack struct {
	binDir    string
	limiter   *servertest.Process
	limiterPG *servertest.Process
	shortener *servertest.Process
	analytics *servertest.Process
	db        *pgxpool.Pool
}

func TestMain(m *testing.M) {
	if os.Getenv(runAsKurzctl) == "1" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	code, err := runTests(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kurzctl tests:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func runTests(m *testing.M) (_ int, err error) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "kurzctl-test-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	stack.binDir = dir
	roomy, err := filepath.Abs(filepath.Join("..", "..", "internal", "app", "testdata", "roomy.yaml"))
	if err != nil {
		return 0, err
	}
	if err := servertest.BuildServices(dir, "limiter", "shortener", "analytics"); err != nil {
		return 0, err
	}
	var pgCfg pgpool.Config
	if err := config.Load(&pgCfg); err != nil {
		return 0, err
	}
	if stack.db, err = pgpool.New(ctx, pgCfg); err != nil {
		return 0, err
	}
	defer stack.db.Close()

	limiterAddr, err := servertest.FreeAddr()
	if err != nil {
		return 0, err
	}
	limiterEnv := func(g, h string) []string {
		return []string{"KURZ_LIMITER_GRPC_ADDR=" + g, "KURZ_LIMITER_HTTP_ADDR=" + h,
			"KURZ_LIMITER_REDIS_TIMEOUT=1s", "KURZ_REDIS_READ_TIMEOUT=1s", "KURZ_REDIS_WRITE_TIMEOUT=1s", "KURZ_LOG_LEVEL=warn"}
	}
	starts := []struct {
		dst     **servertest.Process
		name    string
		service string
		env     func(grpc, http string) []string
	}{
		{&stack.limiter, "limiter", limiterService, func(g, h string) []string {
			return append(limiterEnv(g, h), "KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE="+roomy)
		}},
		{&stack.limiterPG, "limiter", limiterService, func(g, h string) []string {
			// Refreshed only by NOTIFY within a test's time.
			return append(limiterEnv(g, h), "KURZ_LIMITER_RULES_SOURCE=postgres", "KURZ_LIMITER_RULES_REFRESH=1h", "KURZ_LIMITER_RULES_FILE=")
		}},
		{&stack.shortener, "shortener", shortenerService, func(g, h string) []string {
			return []string{"KURZ_SHORTENER_GRPC_ADDR=" + g, "KURZ_SHORTENER_HTTP_ADDR=" + h,
				"KURZ_LIMITER_GRPC_ADDR=" + limiterAddr, "KURZ_SHORTENER_LIMITER_TIMEOUT=1s",
				"KURZ_SHORTENER_BASE_URL=" + shortBase, "KURZ_SHORTENER_ALLOW_ANONYMOUS=false", "KURZ_LOG_LEVEL=warn"}
		}},
		{&stack.analytics, "analytics", analyticsService, func(g, h string) []string {
			return []string{"KURZ_ANALYTICS_GRPC_ADDR=" + g, "KURZ_ANALYTICS_HTTP_ADDR=" + h, "KURZ_LOG_LEVEL=warn"}
		}},
	}
	var wg sync.WaitGroup
	errs := make([]error, len(starts))
	for i, s := range starts {
		grpcAddr := limiterAddr
		if i > 0 {
			if grpcAddr, err = servertest.FreeAddr(); err != nil {
				return 0, err
			}
		}
		httpAddr, err := servertest.FreeAddr()
		if err != nil {
			return 0, err
		}
		wg.Go(func() {
			*s.dst, errs[i] = servertest.StartProcess(s.name, filepath.Join(dir, s.name), grpcAddr, s.service, s.env(grpcAddr, httpAddr)...)
		})
	}
	wg.Wait()
	defer func() {
		for _, p := range []*servertest.Process{stack.analytics, stack.shortener, stack.limiterPG, stack.limiter} {
			if p == nil {
				continue
			}
			if serr := p.Stop(); serr != nil {
				fmt.Fprintf(os.Stderr, "%s did not stop cleanly: %v\n%s\n", p.Name, serr, p.Output())
			}
		}
	}()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return m.Run(), nil
}

// testGateway is a gateway for one test, reached through a proxy that
// gives the test's requests an address of their own (X-Forwarded-For from
// a proxy the gateway trusts), so limits per client IP are the test's.
type testGateway struct {
	url     string // the proxy's: what kurzctl is given
	limiter string // the gateway's limiter, for quota commands
}

// startGateway runs the gateway in-process in front of limiter and the
// stack's shortener and analytics.
func startGateway(t *testing.T, limiter *servertest.Process) testGateway {
	t.Helper()
	env := map[string]string{
		"KURZ_GATEWAY_GRPC_ADDR":       "127.0.0.1:0",
		"KURZ_GATEWAY_HTTP_ADDR":       "127.0.0.1:0",
		"KURZ_LIMITER_GRPC_ADDR":       limiter.GRPCAddr,
		"KURZ_SHORTENER_GRPC_ADDR":     stack.shortener.GRPCAddr,
		"KURZ_ANALYTICS_GRPC_ADDR":     stack.analytics.GRPCAddr,
		"KURZ_GATEWAY_ADMIN_TOKEN":     adminToken,
		"KURZ_GATEWAY_TRUSTED_PROXIES": "127.0.0.1/32, ::1",
		// Generous: under the race detector no call may slip into the
		// fail-open path by accident.
		"KURZ_GATEWAY_LIMITER_TIMEOUT": "1s",
	}
	var cfg app.Config
	if err := config.LoadFrom(servertest.Env(env), &cfg); err != nil {
		t.Fatal(err)
	}
	srv, err := app.New(context.Background(), cfg, servertest.Logger(t))
	if err != nil {
		t.Fatalf("gateway: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "")

	target, err := url.Parse(r.HTTP)
	if err != nil {
		t.Fatal(err)
	}
	ip := newIP()
	proxy := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(target)
		pr.Out.Header.Set("X-Forwarded-For", ip)
	}})
	t.Cleanup(proxy.Close)
	return testGateway{url: proxy.URL, limiter: limiter.GRPCAddr}
}

// newIP returns a client address no other test (or run) uses: a random host
// in 2001:db8::/32, the documentation prefix.
func newIP() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[0], b[1], b[2], b[3] = 0x20, 0x01, 0x0d, 0xb8
	return netip.AddrFrom16(b).String()
}

// newTenantID returns a tenant ID no other test or run uses, deleting the
// tenant's rows (keys cascade), plan and links when the test ends.
func newTenantID(t *testing.T) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	id := fmt.Sprintf("ctl-%x", b)
	cleanupTenants(t, id)
	return id
}

// cleanupTenants deletes what a test wrote for these tenants, when it ends.
func cleanupTenants(t *testing.T, ids ...string) {
	t.Cleanup(func() {
		if err := deleteTenants(ids...); err != nil {
			t.Error(err)
		}
	})
}

func deleteTenants(ids ...string) error {
	ctx := context.Background()
	for _, q := range []string{
		`DELETE FROM gw_tenants WHERE id = ANY($1)`,
		`DELETE FROM rl_tenant_plans WHERE tenant = ANY($1)`,
		`DELETE FROM links WHERE tenant = ANY($1)`,
	} {
		if _, err := stack.db.Exec(ctx, q, ids); err != nil {
			return fmt.Errorf("clean up (%s): %w", q, err)
		}
	}
	return nil
}

// result is one kurzctl run.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// ctl runs kurzctl commands in process against one gateway, with the
// settings in its environment (never the test process's).
type ctl struct {
	t     *testing.T
	env   map[string]string
	stdin string
}

func newCtl(t *testing.T, gw testGateway) *ctl {
	return &ctl{t: t, env: map[string]string{
		"KURZ_URL": gw.url, "KURZ_ADMIN_TOKEN": adminToken, "KURZ_LIMITER_ADDR": gw.limiter,
	}}
}

// withKey returns a copy of c that uses an API key.
func (c *ctl) withKey(key string) *ctl {
	d := *c
	d.env = maps.Clone(c.env)
	d.env["KURZ_API_KEY"] = key
	return &d
}

// run runs one command line.
func (c *ctl) run(args ...string) result {
	c.t.Helper()
	var stdout, stderr bytes.Buffer
	lookup := func(name string) (string, bool) {
		v, ok := c.env[name]
		return v, ok
	}
	code := runIO(context.Background(), args, strings.NewReader(c.stdin), &stdout, &stderr, lookup)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// ok runs a command that must succeed, and returns its stdout.
func (c *ctl) ok(args ...string) string {
	c.t.Helper()
	r := c.run(args...)
	if r.code != 0 {
		c.t.Fatalf("kurzctl %s: %s", strings.Join(args, " "), r)
	}
	if strings.Contains(r.stderr, "goroutine ") || strings.Contains(r.stderr, "panic") {
		c.t.Fatalf("kurzctl %s wrote a trace: %s", strings.Join(args, " "), r.stderr)
	}
	return r.stdout
}

// tenantWithKey creates a tenant on plan with kurzctl and returns a ctl
// using a fresh key of it.
func tenantWithKey(t *testing.T, c *ctl, plan string) (string, *ctl) {
	t.Helper()
	id := newTenantID(t)
	c.ok("tenants", "create", id, "--plan", plan)
	key := strings.TrimSpace(c.ok("keys", "issue", id, "--name", "test", "-q"))
	if !strings.HasPrefix(key, "kurz_") {
		t.Fatalf("keys issue -q printed %q, want the key alone", key)
	}
	return id, c.withKey(key)
}
