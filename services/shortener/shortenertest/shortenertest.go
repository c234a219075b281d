// Package shortenertest boots the shortener in-process for the tests of other
// kurz services (the redirect service's end-to-end tests create links through
// it), against the real PostgreSQL and Redis Cluster of the environment.
package shortenertest

import (
	"context"
	"maps"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/shortener/internal/app"
)

// Option changes how Start boots the shortener beyond its environment.
type Option func(*app.Config)

// WithSpanProcessor samples every trace and hands each span the shortener
// ends to sp (a tracetest.SpanRecorder, say), for tests of trace propagation.
func WithSpanProcessor(sp sdktrace.SpanProcessor) Option {
	return func(c *app.Config) { c.Telemetry.SpanProcessor = sp }
}

// CodeKey is the KURZ_SHORTENER_CODE_KEY Start gives the shortener unless
// overridden (servertest's): a test reads a block code's ID back with
// linkcode.NewPermutation([]byte(CodeKey)).
const CodeKey = servertest.CodeKey

// Start runs a shortener until the test ends. overrides are KURZ_* variables
// on top of the environment; listeners default to free loopback ports and
// the code key to CodeKey.
func Start(t testing.TB, overrides map[string]string, opts ...Option) *servertest.Running {
	t.Helper()
	env := map[string]string{"KURZ_SHORTENER_GRPC_ADDR": "127.0.0.1:0", "KURZ_SHORTENER_HTTP_ADDR": "127.0.0.1:0"}
	maps.Copy(env, overrides)
	var cfg app.Config
	if err := config.LoadFrom(servertest.Env(env), &cfg); err != nil {
		t.Fatal(err)
	}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := app.New(context.Background(), cfg, servertest.Logger(t))
	if err != nil {
		t.Fatalf("shortener: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "kurz.shortener.v1.ShortenerService")
	return r
}

// WithTXT makes VerifyDomain ask r for the _kurz-challenge TXT records
// instead of DNS: tests verify custom domains without the outside world.
func WithTXT(r interface {
	LookupTXT(ctx context.Context, name string) ([]string, error)
}) Option {
	return func(c *app.Config) { c.TXT = r }
}
