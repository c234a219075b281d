//go:build integration

package app

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/gateway/gatewaytest"
)

// downstream is a stand-in for the services behind the gateway: a gRPC
// server with only the health service, whose status the test sets.
func downstream(t *testing.T) (string, *health.Server) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := health.NewServer()
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, hs)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String(), hs
}

// The public listener answers 404 (the API's JSON one) for /readyz,
// /metrics and pprof and 200 for /healthz; the ops listener
// (KURZ_GATEWAY_OPS_ADDR) serves them all.
func TestOpsRoutesAreOnlyOnTheOpsListener(t *testing.T) {
	gw := startGateway(t, map[string]string{"KURZ_PPROF": "true"})
	gw.AssertOpsOffPublic(t)
	gw.AssertOps(t, "limiter", "shortener", "analytics", "postgres")
	if code, _ := gw.GetOps(t, "/debug/pprof/"); code != http.StatusOK {
		t.Errorf("ops /debug/pprof/: %d, want 200", code)
	}
}

func TestReadinessFollowsDownstreamHealth(t *testing.T) {
	addr, hs := downstream(t)
	var cfg Config
	if err := config.LoadFrom(servertest.Env(map[string]string{
		"KURZ_GATEWAY_GRPC_ADDR": "127.0.0.1:0",
		"KURZ_GATEWAY_HTTP_ADDR": "127.0.0.1:0",
		"KURZ_GATEWAY_OPS_ADDR":  "127.0.0.1:0",
		// /readyz answers the checks' last run: run them often.
		"KURZ_READINESS_INTERVAL":  "100ms",
		"KURZ_LIMITER_GRPC_ADDR":   addr,
		"KURZ_SHORTENER_GRPC_ADDR": addr,
		"KURZ_ANALYTICS_GRPC_ADDR": addr,
	}), &cfg); err != nil {
		t.Fatal(err)
	}
	srv, err := New(context.Background(), cfg, servertest.Logger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "")
	r.AssertOps(t, "limiter", "shortener", "analytics", "postgres")

	// Every replica of the downstream NOT_SERVING: the shortener takes the
	// gateway out of rotation; the limiter and analytics, which the gateway
	// can serve without, are reported degraded. The connections learn the
	// status through their health watch.
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	var code int
	var body string
	if !servertest.Eventually(5*time.Second, func() bool {
		// Each connection has its own health watch: wait until all three
		// have heard.
		code, body = r.GetOps(t, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, `"shortener":"unavailable"`) &&
			strings.Contains(body, `"limiter":"degraded"`) && strings.Contains(body, `"analytics":"degraded"`)
	}) {
		t.Errorf("/readyz with downstream NOT_SERVING: got %d %s, want 503 naming shortener unavailable, limiter and analytics degraded", code, body)
	}
	if err := r.Stop(); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}

// The store's settings are refused with the gateway's own, all named at
// once before anything starts (not when the pool is built).
func TestStoreSettingsAreCheckedWithTheRest(t *testing.T) {
	env := gatewaytest.GatewayEnv("127.0.0.1:1", "127.0.0.1:1", "127.0.0.1:1", "kurz-test-admin-token-0123456789abcdef")
	env["KURZ_POSTGRES_MAX_CONNS"] = "0"
	var cfg Config
	if err := config.LoadFrom(servertest.Env(env), &cfg); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Check(); err == nil || !strings.Contains(err.Error(), "KURZ_POSTGRES_MAX_CONNS") {
		t.Errorf("Check: %v; want an error naming KURZ_POSTGRES_MAX_CONNS", err)
	}
}

// The dev overlay's service key and make up's admin token are in this
// repository: a gateway given them is refused before it starts, each
// variable named, unless KURZ_ALLOW_PUBLISHED_SECRETS says it is local.
func TestPublishedSecretsAreRefusedUnlessAllowed(t *testing.T) {
	env := gatewaytest.GatewayEnv("127.0.0.1:1", "127.0.0.1:1", "127.0.0.1:1", "kurz-local-admin-token")
	env["KURZ_SERVICE_AUTH_KEY"] = "dev-only-service-auth-key-0123456789abcdef"
	for _, allowed := range []string{"", "true"} {
		env["KURZ_ALLOW_PUBLISHED_SECRETS"] = allowed
		var cfg Config
		if err := config.LoadFrom(servertest.Env(env), &cfg); err != nil {
			t.Fatal(err)
		}
		err := cfg.Check()
		if allowed == "true" {
			if err != nil {
				t.Errorf("KURZ_ALLOW_PUBLISHED_SECRETS=true: Check: %v, want nil", err)
			}
			continue
		}
		for _, name := range []string{"KURZ_GATEWAY_ADMIN_TOKEN", "KURZ_SERVICE_AUTH_KEY"} {
			if err == nil || !strings.Contains(err.Error(), name+" holds a value published") {
				t.Errorf("Check: %v; want an error naming %s as published", err, name)
			}
		}
	}
}
