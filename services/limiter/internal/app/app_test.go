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

func TestBreakerSettingsAreChecked(t *testing.T) {
	for _, env := range []map[string]string{
		{"KURZ_LIMITER_BREAKER_COOLDOWN": "0s"},
		{"KURZ_LIMITER_BREAKER_COOLDOWN": "500ms", "KURZ_LIMITER_BREAKER_MAX_COOLDOWN": "200ms"},
	} {
		if err := load(t, env).validate(); err == nil || !strings.Contains(err.Error(), "KURZ_LIMITER_BREAKER_MAX_COOLDOWN") {
			t.Errorf("%v: got %v, want an error naming both cooldowns", env, err)
		}
	}
	// A cooldown alone, longer than the default longest (1s), stays valid
	// as it was before there was a longest: the engine takes it as both.
	for _, env := range []map[string]string{
		{"KURZ_LIMITER_BREAKER_COOLDOWN": "2s"},
		{"KURZ_LIMITER_BREAKER_COOLDOWN": "2s", "KURZ_LIMITER_BREAKER_MAX_COOLDOWN": "2s"},
	} {
		if err := load(t, env).validate(); err != nil {
			t.Errorf("%v: %v", env, err)
		}
	}
}

func TestFleetSettingsAreChecked(t *testing.T) {
	if err := load(t, nil).validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"KURZ_LIMITER_FLEET": "a{b}"}, "KURZ_LIMITER_FLEET"},
		{map[string]string{"KURZ_LIMITER_FLEET": strings.Repeat("x", 65)}, "KURZ_LIMITER_FLEET"},
		{map[string]string{"KURZ_LIMITER_REPLICAS": "3", "KURZ_LIMITER_MAX_REPLICAS": "2"}, "KURZ_LIMITER_MAX_REPLICAS"},
	} {
		err := load(t, c.env).validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an error naming %s", c.env, err, c.want)
		}
	}
	// The live count off, as before fleets.
	if err := load(t, map[string]string{"KURZ_LIMITER_FLEET_HEARTBEAT": "0s", "KURZ_LIMITER_REPLICAS": "3"}).validate(); err != nil {
		t.Errorf("heartbeat off: %v", err)
	}
}
