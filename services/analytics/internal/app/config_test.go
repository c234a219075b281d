package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/testkit/servertest"
)

func rnd() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func load(t *testing.T, overrides map[string]string) Config {
	t.Helper()
	base := map[string]string{
		"KURZ_ANALYTICS_GRPC_ADDR": "127.0.0.1:0", "KURZ_ANALYTICS_HTTP_ADDR": "127.0.0.1:0",
		// Every test has its own group on its own streams (see start).
		"KURZ_ANALYTICS_CONSUMER_GROUP": "g-" + rnd(),
		"KURZ_ANALYTICS_BATCH_AGE":      "50ms",
		"KURZ_ANALYTICS_CLAIM_IDLE":     "1s",
		"KURZ_CLICK_STREAM_SHARDS":      "4",
	}
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
	cfg := load(t, map[string]string{"KURZ_CLICKHOUSE_ADDRS": "127.0.0.1:1", "KURZ_CLICKHOUSE_DIAL_TIMEOUT": "200ms"})
	_, err := New(context.Background(), cfg, servertest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "KURZ_CLICKHOUSE_ADDRS") {
		t.Fatalf("got %v, want an error naming KURZ_CLICKHOUSE_ADDRS", err)
	}
}

func TestRefusesBadSettings(t *testing.T) {
	cfg := load(t, map[string]string{"KURZ_ANALYTICS_BATCH_SIZE": "0", "KURZ_ANALYTICS_CLAIM_IDLE": "10ms", "KURZ_SERVICE_AUTH_KEY": "too-short",
		"KURZ_ANALYTICS_RETENTION_EVERY": "0s"})
	_, err := New(context.Background(), cfg, servertest.Logger(t))
	for _, name := range []string{"KURZ_ANALYTICS_BATCH_SIZE", "KURZ_ANALYTICS_CLAIM_IDLE", "KURZ_SERVICE_AUTH_KEY", "KURZ_ANALYTICS_RETENTION_EVERY"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("got %v, want it to name %s", err, name)
		}
	}
}

// The stores' settings are refused with the service's own, all named at
// once before anything starts (not one at a time as each store is built).
func TestStoreSettingsAreCheckedWithTheRest(t *testing.T) {
	err := load(t, map[string]string{"KURZ_REDIS_POOL_SIZE": "0"}).Check()
	for _, name := range []string{"KURZ_REDIS_POOL_SIZE"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("Check: %v; want an error naming %s", err, name)
		}
	}
}

// A period near zero runs its loop as fast as its work completes; each has
// a floor, refused by name below it and accepted at it.
func TestPeriodsHaveAFloor(t *testing.T) {
	for name, floor := range map[string]string{"KURZ_ANALYTICS_RETENTION_EVERY": "1m"} {
		for _, v := range []string{"1ns", "59s"} {
			if _, err := load(t, map[string]string{name: v}).validate(); err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s=%s: %v, want an error naming it", name, v, err)
			}
		}
		if _, err := load(t, map[string]string{name: floor}).validate(); err != nil {
			t.Errorf("%s=%s: %v, want accepted", name, floor, err)
		}
	}
}

// KURZ_ANALYTICS_RAW_RETENTION=1s (or 90m, meant as days) was taken: at
// start analytics dropped, for good, the raw clicks of every month before
// the current one. Below a day it is refused; 0 still keeps them all.
func TestRefusesARawRetentionUnderADay(t *testing.T) {
	for _, r := range []string{"1s", "90m", "23h59m"} {
		err := load(t, map[string]string{"KURZ_ANALYTICS_RAW_RETENTION": r}).Check()
		if err == nil || !strings.Contains(err.Error(), "KURZ_ANALYTICS_RAW_RETENTION") {
			t.Errorf("KURZ_ANALYTICS_RAW_RETENTION=%s: %v, want an error naming it", r, err)
		}
	}
	for _, r := range []string{"0", "24h", "2160h"} {
		if err := load(t, map[string]string{"KURZ_ANALYTICS_RAW_RETENTION": r}).Check(); err != nil {
			t.Errorf("KURZ_ANALYTICS_RAW_RETENTION=%s: %v, want accepted", r, err)
		}
	}
}
