package app

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/testkit/servertest"
)

func load(t *testing.T, overrides map[string]string) Config {
	t.Helper()
	base := map[string]string{"KURZ_REDIRECT_GRPC_ADDR": "127.0.0.1:0", "KURZ_REDIRECT_HTTP_ADDR": "127.0.0.1:0",
		"KURZ_REDIRECT_OPS_ADDR": "127.0.0.1:0"}
	maps.Copy(base, overrides)
	var cfg Config
	if err := config.LoadFrom(servertest.Env(base), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestRejectsBadConfigurationNamingEachVariable(t *testing.T) {
	cfg := load(t, map[string]string{
		"KURZ_REDIRECT_DEFAULT_STATUS":      "303",
		"KURZ_REDIRECT_MISS_FAILURE_POLICY": "sometimes",
		"KURZ_CLICK_STREAM_SHARDS":          "0",
		"KURZ_REDIRECT_HOME_URL":            "example.com",
		"KURZ_REDIRECT_PASSWORD_CHECKS":     "65",
	})
	_, err := New(context.Background(), cfg, servertest.Logger(t))
	for _, name := range []string{"KURZ_REDIRECT_DEFAULT_STATUS", "KURZ_REDIRECT_MISS_FAILURE_POLICY", "KURZ_CLICK_STREAM_SHARDS", "KURZ_REDIRECT_HOME_URL", "KURZ_REDIRECT_PASSWORD_CHECKS"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("got %v, want it to name %s", err, name)
		}
	}
}

// A form secret or visitor salt this repository publishes (the dev
// overlay's, make up's) is refused at start, naming the variable and not
// the value, unless KURZ_ALLOW_PUBLISHED_SECRETS says this is a local setup.
func TestPublishedSecretsRefusedUnlessAllowed(t *testing.T) {
	published := config.PublishedSecrets()
	var salt, secret string
	for _, v := range published {
		switch {
		case strings.Contains(v, "visitor-salt"):
			salt = v
		case strings.Contains(v, "form-secret"):
			secret = v
		}
	}
	if salt == "" || secret == "" {
		t.Fatalf("no published visitor salt or form secret in %d published values", len(published))
	}
	env := map[string]string{"KURZ_REDIRECT_VISITOR_SALT": salt, "KURZ_REDIRECT_FORM_SECRET": secret}
	_, _, err := load(t, env).validate()
	for _, name := range []string{"KURZ_REDIRECT_VISITOR_SALT", "KURZ_REDIRECT_FORM_SECRET"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("published %s: %v, want an error naming it", name, err)
		}
	}
	if err != nil && (strings.Contains(err.Error(), salt) || strings.Contains(err.Error(), secret)) {
		t.Errorf("the error shows the secret: %v", err)
	}
	env["KURZ_ALLOW_PUBLISHED_SECRETS"] = "true"
	if _, _, err := load(t, env).validate(); err != nil {
		t.Errorf("KURZ_ALLOW_PUBLISHED_SECRETS=true: %v, want nil", err)
	}
}

// A header without a proxy to believe it from is a configuration error,
// named in the message, not a silent fallback to the peer.
func TestClientIPHeaderWithoutTrustedProxiesRefused(t *testing.T) {
	cfg := load(t, map[string]string{"KURZ_REDIRECT_CLIENT_IP_HEADER": "X-Forwarded-For"})
	if _, _, err := cfg.validate(); err == nil {
		t.Fatal("KURZ_REDIRECT_CLIENT_IP_HEADER without KURZ_REDIRECT_TRUSTED_PROXIES was accepted")
	} else if want := "KURZ_REDIRECT_TRUSTED_PROXIES"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name %s", err, want)
	}
	cfg = load(t, map[string]string{"KURZ_CLIENT_IPV6_PREFIX": "32"})
	if _, _, err := cfg.validate(); err == nil {
		t.Error("KURZ_CLIENT_IPV6_PREFIX=32 was accepted")
	}
}

// A KURZ_GEOIP_DB that is not a database fails the start, naming the
// variable, before any store is dialled (so this needs no stack).
func TestBadGeoIPDatabaseFailsTheStart(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "country.mmdb")
	if err := os.WriteFile(bad, []byte("not a database"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{"damaged": bad, "missing": bad + ".missing"} {
		t.Run(name, func(t *testing.T) {
			cfg := load(t, map[string]string{"KURZ_GEOIP_DB": path, "KURZ_REDIS_ADDRS": "127.0.0.1:1"})
			_, err := New(context.Background(), cfg, servertest.Logger(t))
			if err == nil || !strings.Contains(err.Error(), "KURZ_GEOIP_DB") || !strings.Contains(err.Error(), path) {
				t.Fatalf("got %v, want an error naming KURZ_GEOIP_DB and %s", err, path)
			}
		})
	}
}

// The stores' settings are refused with the service's own, all named at
// once before anything starts (not one at a time as each store is built).
func TestStoreSettingsAreCheckedWithTheRest(t *testing.T) {
	err := load(t, map[string]string{"KURZ_REDIS_POOL_SIZE": "0", "KURZ_POSTGRES_MAX_CONNS": "0"}).Check()
	for _, name := range []string{"KURZ_REDIS_POOL_SIZE", "KURZ_POSTGRES_MAX_CONNS"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("Check: %v; want an error naming %s", err, name)
		}
	}
}

// The visitor hash's key and the forms' key are refused under 32
// characters: the visitor hash covers the day, IP and user agent, so with a
// key short enough to find by trying, every IPv4 address behind a stored
// hash could be found too.
func TestShortSecretsRefused(t *testing.T) {
	for _, name := range []string{"KURZ_REDIRECT_VISITOR_SALT", "KURZ_REDIRECT_FORM_SECRET"} {
		if _, _, err := load(t, map[string]string{name: strings.Repeat("s", 31)}).validate(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s of 31 characters: %v, want an error naming it", name, err)
		}
		if _, _, err := load(t, map[string]string{name: strings.Repeat("s", 32)}).validate(); err != nil {
			t.Errorf("%s of 32 characters: %v, want accepted", name, err)
		}
	}
}

// The click buffer and batch are allocated at start: a value past what a
// pod's memory holds is refused by name, not left to fail the start with
// an out-of-memory crash that names nothing.
func TestClickBufferAndBatchAreBounded(t *testing.T) {
	for name, bound := range map[string]int{"KURZ_REDIRECT_CLICK_BUFFER": maxClickBuffer, "KURZ_REDIRECT_CLICK_BATCH": maxClickBatch} {
		if _, _, err := load(t, map[string]string{name: strconv.Itoa(bound)}).validate(); err != nil {
			t.Errorf("%s=%d: %v, want accepted", name, bound, err)
		}
		for _, v := range []string{strconv.Itoa(bound + 1), "99999999999"} {
			if _, _, err := load(t, map[string]string{name: v}).validate(); err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s=%s: %v, want an error naming it", name, v, err)
			}
		}
	}
}

// A period near zero runs its loop as fast as its work completes (each
// shard's click writer, a read of every verified domain, a stat of the
// GeoIP file); each has a floor, refused by name below it and accepted at
// it.
func TestPeriodsHaveAFloor(t *testing.T) {
	for name, floor := range map[string]time.Duration{
		"KURZ_REDIRECT_CLICK_FLUSH_INTERVAL": 10 * time.Millisecond,
		"KURZ_REDIRECT_DOMAIN_REFRESH":       100 * time.Millisecond,
		"KURZ_GEOIP_RELOAD_INTERVAL":         time.Second,
	} {
		for _, d := range []time.Duration{time.Nanosecond, floor - time.Millisecond} {
			if _, _, err := load(t, map[string]string{name: d.String()}).validate(); err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s=%s: %v, want an error naming it", name, d, err)
			}
		}
		if _, _, err := load(t, map[string]string{name: floor.String()}).validate(); err != nil {
			t.Errorf("%s=%s: %v, want accepted", name, floor, err)
		}
	}
	if _, _, err := load(t, map[string]string{"KURZ_GEOIP_RELOAD_INTERVAL": "0s"}).validate(); err != nil {
		t.Errorf("KURZ_GEOIP_RELOAD_INTERVAL=0s (never): %v, want accepted", err)
	}
}
