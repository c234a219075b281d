package app

import (
	"context"
	"strings"
	"testing"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/testkit/servertest"
)

func load(t *testing.T, overrides map[string]string) Config {
	t.Helper()
	base := map[string]string{"KURZ_LIMITER_GRPC_ADDR": "127.0.0.1:0", "KURZ_LIMITER_HTTP_ADDR": "127.0.0.1:0"}
	for k, v := range overrides {
		base[k] = v
	}
	var cfg Config
	if err := config.LoadFrom(servertest.Env(base), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestFailsFastNamingTheMissingDependency(t *testing.T) {
	cfg := load(t, map[string]string{"KURZ_REDIS_ADDRS": "127.0.0.1:1", "KURZ_REDIS_DIAL_TIMEOUT": "200ms"})
	_, err := New(context.Background(), cfg, servertest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "KURZ_REDIS_ADDRS") {
		t.Fatalf("got %v, want an error naming KURZ_REDIS_ADDRS", err)
	}
}

// A misspelt Envoy header style stops the limiter at start, naming the
// variable, rather than falling back to a style nobody chose.
func TestUnknownEnvoyHeaderStyleRefused(t *testing.T) {
	cfg := load(t, map[string]string{"KURZ_LIMITER_ENVOY_HEADERS": "ietf"})
	_, err := New(context.Background(), cfg, servertest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "KURZ_LIMITER_ENVOY_HEADERS") {
		t.Fatalf("got %v, want an error naming KURZ_LIMITER_ENVOY_HEADERS", err)
	}
}
