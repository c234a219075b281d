package app

import (
	"context"
	"errors"
	"maps"
	"net"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/testkit/servertest"
)

// The tests of this file need nothing running: the configuration is refused
// before any connection, or the one connection is refused at once.

// load is the configuration of a test shortener on loopback ports, with
// overrides.
func load(t testing.TB, overrides map[string]string) Config {
	t.Helper()
	base := map[string]string{"KURZ_SHORTENER_GRPC_ADDR": "127.0.0.1:0", "KURZ_SHORTENER_HTTP_ADDR": "127.0.0.1:0"}
	maps.Copy(base, overrides)
	var cfg Config
	if err := config.LoadFrom(servertest.Env(base), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestFailsFastNamingTheMissingDependency(t *testing.T) {
	cfg := load(t, map[string]string{"KURZ_POSTGRES_URL": "postgres://kurz:kurz@127.0.0.1:1/kurz?sslmode=disable"})
	_, err := New(context.Background(), cfg, servertest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "KURZ_POSTGRES_URL") {
		t.Fatalf("got %v, want an error naming KURZ_POSTGRES_URL", err)
	}
}

func TestRejectsBadConfigurationNamingEachVariable(t *testing.T) {
	cfg := load(t, map[string]string{
		"KURZ_SHORTENER_BLOCK_SIZE":             "0",
		"KURZ_SHORTENER_RANDOM_CODE_LENGTH":     "2",
		"KURZ_SHORTENER_LIMITER_FAILURE_POLICY": "maybe",
		"KURZ_SHORTENER_BASE_URL":               "ftp://x",
		"KURZ_SHORTENER_INVALIDATION_RETRY":     "0s",
		"KURZ_SHORTENER_CACHE_REPLICAS":         "-1",
		"KURZ_SERVICE_AUTH_KEY":                 "",
	})
	_, err := New(context.Background(), cfg, servertest.Logger(t))
	for _, name := range []string{"KURZ_SHORTENER_BLOCK_SIZE", "KURZ_SHORTENER_RANDOM_CODE_LENGTH",
		"KURZ_SHORTENER_LIMITER_FAILURE_POLICY", "KURZ_SHORTENER_BASE_URL", "KURZ_SHORTENER_INVALIDATION_RETRY",
		"KURZ_SHORTENER_CACHE_REPLICAS", "KURZ_SERVICE_AUTH_KEY"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("got %v, want it to name %s", err, name)
		}
	}
}

// TestRefusesToStartWithoutACodeKey: without KURZ_SHORTENER_CODE_KEY, or
// with one too short to be a secret, the shortener does not start (it would
// otherwise hand out codes anyone could walk), and says which variable.
func TestRefusesToStartWithoutACodeKey(t *testing.T) {
	for _, key := range []string{"", "too-short-a-key"} {
		cfg := load(t, map[string]string{"KURZ_SHORTENER_CODE_KEY": key})
		srv, err := New(context.Background(), cfg, servertest.Logger(t))
		if err == nil {
			_ = srv.Close(context.Background())
			t.Fatalf("key of %d characters: the shortener started", len(key))
		}
		if !strings.Contains(err.Error(), "KURZ_SHORTENER_CODE_KEY") {
			t.Errorf("key of %d characters: got %v, want an error naming KURZ_SHORTENER_CODE_KEY", len(key), err)
		}
	}
}

// The dev overlay's code key is in this repository: anyone could invert
// the codes of a shortener using it, so it is refused unless
// KURZ_ALLOW_PUBLISHED_SECRETS says this is a local setup.
func TestRefusesAPublishedCodeKeyUnlessAllowed(t *testing.T) {
	const published = "dev-only-shortener-code-key-0123456789abcdef"
	cfg := load(t, map[string]string{"KURZ_SHORTENER_CODE_KEY": published})
	if err := cfg.Check(); err == nil || !strings.Contains(err.Error(), "KURZ_SHORTENER_CODE_KEY holds a value published") {
		t.Errorf("Check: %v; want an error naming KURZ_SHORTENER_CODE_KEY as published", err)
	}
	cfg = load(t, map[string]string{"KURZ_SHORTENER_CODE_KEY": published, "KURZ_ALLOW_PUBLISHED_SECRETS": "true"})
	if err := cfg.Check(); err != nil {
		t.Errorf("KURZ_ALLOW_PUBLISHED_SECRETS=true: Check: %v, want nil", err)
	}
}

func TestRejectsBadWebhookConfigurationNamingEachVariable(t *testing.T) {
	cfg := load(t, map[string]string{
		"KURZ_SHORTENER_WEBHOOK_KEY":               "short",
		"KURZ_SHORTENER_WEBHOOK_ALLOW_CIDRS":       "10.0.0.0/8,not-a-cidr",
		"KURZ_SHORTENER_WEBHOOK_MAX_SUBSCRIPTIONS": "0",
		"KURZ_SHORTENER_WEBHOOK_MAX_PENDING":       "5",
		"KURZ_SHORTENER_WEBHOOK_KEEP_FINISHED":     "10",
		"KURZ_SHORTENER_WEBHOOK_CONCURRENCY":       "1000",
		"KURZ_SHORTENER_WEBHOOK_MAX_ATTEMPTS":      "0",
		"KURZ_SHORTENER_WEBHOOK_TIMEOUT":           "2m",
		"KURZ_SHORTENER_WEBHOOK_CLICK_INTERVAL":    "10ms",
	})
	_, err := New(context.Background(), cfg, servertest.Logger(t))
	for _, name := range []string{"KURZ_SHORTENER_WEBHOOK_KEY", `"not-a-cidr"`, "KURZ_SHORTENER_WEBHOOK_MAX_SUBSCRIPTIONS",
		"KURZ_SHORTENER_WEBHOOK_MAX_PENDING", "KURZ_SHORTENER_WEBHOOK_CONCURRENCY", "KURZ_SHORTENER_WEBHOOK_MAX_ATTEMPTS", "KURZ_SHORTENER_WEBHOOK_TIMEOUT",
		"KURZ_SHORTENER_WEBHOOK_CLICK_INTERVAL", "KURZ_SHORTENER_WEBHOOK_KEEP_FINISHED"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("got %v, want it to name %s", err, name)
		}
	}
}

// A rotation's previous webhook key is checked as the key is, and is
// neither the key in use nor "derived" while the derived key is in use.
func TestRejectsABadPreviousWebhookKey(t *testing.T) {
	key := strings.Repeat("n", 32)
	for _, tc := range []struct{ key, previous, want string }{
		{key, "short", "KURZ_SHORTENER_WEBHOOK_PREVIOUS_KEY has 5 characters"},
		{key, key, "KURZ_SHORTENER_WEBHOOK_PREVIOUS_KEY is KURZ_SHORTENER_WEBHOOK_KEY"},
		{"", "derived", "KURZ_SHORTENER_WEBHOOK_PREVIOUS_KEY=derived names the key in use"},
	} {
		err := load(t, map[string]string{"KURZ_SHORTENER_WEBHOOK_KEY": tc.key, "KURZ_SHORTENER_WEBHOOK_PREVIOUS_KEY": tc.previous}).Check()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("key %q, previous %q: Check: %v; want %q", tc.key, tc.previous, err, tc.want)
		}
	}
	for _, previous := range []string{"", "derived", strings.Repeat("o", 32)} {
		if err := load(t, map[string]string{"KURZ_SHORTENER_WEBHOOK_KEY": key, "KURZ_SHORTENER_WEBHOOK_PREVIOUS_KEY": previous}).Check(); err != nil {
			t.Errorf("previous %q: Check: %v, want nil", previous, err)
		}
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

// A period near zero runs its loop as fast as its work completes (a stat
// of the blocklist, a retry round, a query for due deliveries); each has a
// floor, refused by name below it and accepted at it.
func TestPeriodsHaveAFloor(t *testing.T) {
	for name, floor := range map[string]time.Duration{
		"KURZ_SHORTENER_BLOCKLIST_RELOAD":      10 * time.Millisecond,
		"KURZ_SHORTENER_INVALIDATION_RETRY":    10 * time.Millisecond,
		"KURZ_SHORTENER_WEBHOOK_POLL_INTERVAL": 50 * time.Millisecond,
	} {
		for _, d := range []time.Duration{time.Nanosecond, floor - time.Millisecond} {
			if _, _, _, err := load(t, map[string]string{name: d.String()}).validate(); err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s=%s: %v, want an error naming it", name, d, err)
			}
		}
		if _, _, _, err := load(t, map[string]string{name: floor.String()}).validate(); err != nil && strings.Contains(err.Error(), name) {
			t.Errorf("%s=%s: %v, want accepted", name, floor, err)
		}
	}
}

// A failed lookup at KURZ_SHORTENER_DNS_SERVER names that server (which
// VerifyDomain's log shows), not the system resolver's it never asked.
func TestTXTLookupErrorsNameTheConfiguredServer(t *testing.T) {
	// A UDP socket that never answers: the lookup times out.
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	server := silent.LocalAddr().String()
	r := txtResolver(Config{DNSServer: server})
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err = r.LookupTXT(ctx, "_kurz-challenge.go.acme.example.")
	var dnsErr *net.DNSError
	if !errors.As(err, &dnsErr) || dnsErr.Server != server {
		t.Errorf("lookup at %s: %v (server %q), want a DNS error naming %s", server, err, dnsErr.Server, server)
	}
}
