package app

import (
	"context"
	"slices"
	"strings"
	"testing"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/server/servertest"
)

func load(t *testing.T, overrides map[string]string) Config {
	t.Helper()
	base := map[string]string{"KURZ_REDIRECT_GRPC_ADDR": "127.0.0.1:0", "KURZ_REDIRECT_HTTP_ADDR": "127.0.0.1:0"}
	for k, v := range overrides {
		base[k] = v
	}
	var cfg Config
	if err := config.LoadFrom(servertest.Env(base), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestBootsHealthyWithGRPCHealthOnly(t *testing.T) {
	srv, err := New(context.Background(), load(t, nil), servertest.Logger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "")
	r.AssertOps(t, "redis", "postgres")
	want := []string{"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"}
	if got := r.GRPCServices(t); !slices.Equal(got, want) {
		t.Errorf("reflection lists %v, want %v", got, want)
	}
	if err := r.Stop(); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}

func TestFailsFastNamingTheMissingDependency(t *testing.T) {
	cfg := load(t, map[string]string{"KURZ_POSTGRES_URL": "postgres://kurz:kurz@127.0.0.1:1/kurz?sslmode=disable"})
	_, err := New(context.Background(), cfg, servertest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "KURZ_POSTGRES_URL") {
		t.Fatalf("got %v, want an error naming KURZ_POSTGRES_URL", err)
	}
}
