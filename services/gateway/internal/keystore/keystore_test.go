//go:build integration

package keystore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/services/gateway/internal/keystore/migrations"
)

// newStore migrates the gateway schema into the test database (kurz_test
// under make test) and returns a store with one fresh tenant, inserted
// directly (plans are the app tests' business: they need the limiter's
// tables), removed when the test ends.
func newStore(t *testing.T) (*Store, string) {
	t.Helper()
	ctx := context.Background()
	var cfg pgpool.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	db, err := pgpool.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if _, err := pgpool.Migrate(ctx, db, migrations.Component, migrations.FS); err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	tenant := fmt.Sprintf("ks-%x", b)
	if _, err := db.Exec(ctx, `INSERT INTO gw_tenants (id, plan) VALUES ($1, 'free')`, tenant); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.Exec(context.Background(), `DELETE FROM gw_tenants WHERE id = $1`, tenant); err != nil {
			t.Errorf("clean up: %v", err)
		}
	})
	return New(db, 2*time.Second), tenant
}

// A key authenticates as its tenant until revoked; a changed secret, an
// unknown ID or a malformed key never does, and all three look the same.
func TestKeys(t *testing.T) {
	ctx := context.Background()
	s, tenant := newStore(t)
	k, full, err := s.IssueKey(ctx, tenant, "ci")
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := ParseKeyID(full); !ok || id != k.ID || k.Tenant != tenant || k.Name != "ci" {
		t.Fatalf("issued %+v as %q", k, full)
	}
	p, err := s.Authenticate(ctx, full)
	if err != nil || p != (Principal{Tenant: tenant, KeyID: k.ID}) {
		t.Fatalf("Authenticate: %+v, %v", p, err)
	}
	flipped := full[:len(full)-1] + "a"
	if strings.HasSuffix(full, "a") {
		flipped = full[:len(full)-1] + "b"
	}
	for name, key := range map[string]string{
		"changed secret": flipped,
		"unknown id":     KeyPrefix + "AAAAAAAAAAAA_" + strings.Repeat("B", keySecretLen),
		"malformed":      "kurz_" + k.ID,
		"empty":          "",
	} {
		if _, err := s.Authenticate(ctx, key); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("%s: %v, want ErrInvalidKey", name, err)
		}
	}
	if _, err := s.RevokeKey(ctx, "someone-else", k.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("revoke through another tenant: %v, want ErrNotFound", err)
	}
	revoked, err := s.RevokeKey(ctx, tenant, k.ID)
	if err != nil || revoked.Revoked == nil {
		t.Fatalf("RevokeKey: %+v %v", revoked, err)
	}
	if _, err := s.Authenticate(ctx, full); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("revoked key: %v, want ErrInvalidKey", err)
	}
	again, err := s.RevokeKey(ctx, tenant, k.ID)
	if err != nil || !again.Revoked.Equal(*revoked.Revoked) {
		t.Errorf("revoking again: %+v %v; want the first revocation time kept", again, err)
	}
	keys, err := s.Keys(ctx, tenant)
	if err != nil || len(keys) != 1 || keys[0].ID != k.ID || keys[0].Revoked == nil {
		t.Errorf("Keys: %+v %v", keys, err)
	}
	if _, _, err := s.IssueKey(ctx, "no-such-tenant-ks", ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("IssueKey for an unknown tenant: %v, want ErrNotFound", err)
	}
	if _, err := s.SetPlan(ctx, "no-such-tenant-ks", "pro"); !errors.Is(err, ErrNotFound) {
		t.Errorf("SetPlan for an unknown tenant: %v, want ErrNotFound", err)
	}
	if _, err := s.Keys(ctx, "no-such-tenant-ks"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Keys of an unknown tenant: %v, want ErrNotFound", err)
	}
}
