// Package shortenertest boots the shortener in-process for the tests of other
// kurz services (the redirect service's end-to-end tests create links through
// it), against the real PostgreSQL and Redis Cluster of the environment.
package shortenertest

import (
	"context"
	"maps"
	"testing"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/server/servertest"
	"kurz.dev/services/shortener/internal/app"
)

// Start runs a shortener until the test ends. overrides are KURZ_* variables
// on top of the environment; listeners default to free loopback ports.
func Start(t testing.TB, overrides map[string]string) *servertest.Running {
	t.Helper()
	env := map[string]string{"KURZ_SHORTENER_GRPC_ADDR": "127.0.0.1:0", "KURZ_SHORTENER_HTTP_ADDR": "127.0.0.1:0"}
	maps.Copy(env, overrides)
	var cfg app.Config
	if err := config.LoadFrom(servertest.Env(env), &cfg); err != nil {
		t.Fatal(err)
	}
	srv, err := app.New(context.Background(), cfg, servertest.Logger(t))
	if err != nil {
		t.Fatalf("shortener: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "kurz.shortener.v1.ShortenerService")
	return r
}
