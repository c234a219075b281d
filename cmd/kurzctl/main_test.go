//go:build integration

package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kurz.dev/pkg/testkit/servertest"
	stackgate "kurz.dev/pkg/testkit/stack"
	"kurz.dev/services/gateway/gatewaytest"
)

// shortBase is the test shortener's short-link host: make up's, so the
// README's outputs read the same here and there.
const shortBase = gatewaytest.ShortBase

// adminToken is the test gateways' admin credential.
const adminToken = "test-admin-token-0123456789abcdef"

// runAsKurzctl, set in a process's environment, makes the test binary be
// kurzctl: the README test runs its examples with bash, through a
// "kurzctl" symlink to this binary, so they exercise the code under test.
const runAsKurzctl = "KURZCTL_TEST_RUN_AS_MAIN"

// stack is what TestMain starts once: the gateway's services, the file
// limiter on the gateway tests' roomy rules (the one on PostgreSQL is as
// under make up, where tenant plans apply).
var stack struct{ *gatewaytest.Stack }

func TestMain(m *testing.M) {
	if os.Getenv(runAsKurzctl) == "1" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	// The stack's services run on all three engines.
	stackgate.Gate(stackgate.All...)
	code, err := runTests(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kurzctl tests:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func runTests(m *testing.M) (_ int, err error) {
	roomy, err := filepath.Abs(filepath.Join("..", "..", "services", "gateway", "internal", "app", "testdata", "roomy.yaml"))
	if err != nil {
		return 0, err
	}
	if stack.Stack, err = gatewaytest.Start(roomy); err != nil {
		return 0, err
	}
	defer stack.Close()
	if err := servertest.BuildServices(stack.BinDir, "gateway"); err != nil {
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

// startGateway runs a gateway process in front of limiter and the stack's
// shortener and analytics.
func startGateway(t *testing.T, limiter *servertest.Process) testGateway {
	t.Helper()
	env := gatewaytest.GatewayEnv(limiter.GRPCAddr, stack.Shortener.GRPCAddr, stack.Analytics.GRPCAddr, adminToken)
	env["KURZ_GATEWAY_TRUSTED_PROXIES"] = "127.0.0.1/32, ::1"
	httpAddr, err := servertest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	servertest.Run(t, stack.BinDir, servertest.Spec{Name: "gateway", HTTPAddr: httpAddr, Env: func(g, h string) []string {
		env["KURZ_GATEWAY_GRPC_ADDR"], env["KURZ_GATEWAY_HTTP_ADDR"] = g, h
		list := make([]string, 0, len(env))
		for k, v := range env {
			list = append(list, k+"="+v)
		}
		return list
	}})

	target, err := url.Parse("http://" + httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	ip := gatewaytest.NewIP()
	proxy := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(target)
		pr.Out.Header.Set("X-Forwarded-For", ip)
	}})
	t.Cleanup(proxy.Close)
	return testGateway{url: proxy.URL, limiter: limiter.GRPCAddr}
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
func cleanupTenants(t *testing.T, ids ...string) { gatewaytest.CleanupTenants(t, stack.DB, ids...) }

func newCtl(t *testing.T, gw testGateway) *ctl {
	return &ctl{t: t, env: map[string]string{
		"KURZ_URL": gw.url, "KURZ_GATEWAY_ADMIN_TOKEN": adminToken, "KURZ_LIMITER_ADDR": gw.limiter,
	}}
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
