//go:build integration

package keystore

import (
	"context"
	"errors"
	"testing"

	"kurz.dev/pkg/linkschema"
)

// A suspended tenant's valid keys answer ErrTenantSuspended (wrong and
// revoked ones still ErrInvalidKey: a guess learns nothing about the
// tenant), the shortener's tenant_suspensions lists it, a second suspend
// keeps the first time and takes the new reason, and resume brings all
// back; unknown tenants are ErrNotFound.
func TestSuspendAndResume(t *testing.T) {
	ctx := context.Background()
	s, tenant := newStore(t)
	if _, err := linkschema.Apply(ctx, s.db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := s.db.Exec(context.Background(), `DELETE FROM tenant_suspensions WHERE tenant = $1`, tenant); err != nil {
			t.Errorf("clean up: %v", err)
		}
	})
	k, full, err := s.IssueKey(ctx, tenant, "ci")
	if err != nil {
		t.Fatal(err)
	}
	revoked, revokedFull, err := s.IssueKey(ctx, tenant, "old")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.RevokeKey(ctx, tenant, revoked.ID); err != nil {
		t.Fatal(err)
	}
	listed := func() bool {
		t.Helper()
		var n int
		if err := s.db.QueryRow(ctx, `SELECT count(*) FROM tenant_suspensions WHERE tenant = $1`, tenant).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}

	first, err := s.Suspend(ctx, tenant, "phishing")
	if err != nil || first.Suspended == nil || first.SuspendReason != "phishing" || first.Plan != "free" {
		t.Fatalf("Suspend: %+v, %v", first, err)
	}
	if !listed() {
		t.Error("tenant_suspensions does not list the suspended tenant")
	}
	if p, err := s.Authenticate(ctx, full); !errors.Is(err, ErrTenantSuspended) || p.Tenant == "" || p.KeyID == "" {
		t.Errorf("valid key of a suspended tenant: %+v, %v; want ErrTenantSuspended with the key's principal", p, err)
	}
	if _, err := s.Authenticate(ctx, revokedFull); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("revoked key of a suspended tenant: %v, want ErrInvalidKey", err)
	}
	again, err := s.Suspend(ctx, tenant, "phishing, ticket ABUSE-12")
	if err != nil || !again.Suspended.Equal(*first.Suspended) || again.SuspendReason != "phishing, ticket ABUSE-12" {
		t.Errorf("suspending again: %+v, %v; want the first time (%v) and the new reason", again, err, first.Suspended)
	}
	if got, err := s.Tenant(ctx, tenant); err != nil || got.Suspended == nil || got.SuspendReason != again.SuspendReason {
		t.Errorf("Tenant while suspended: %+v, %v", got, err)
	}

	for range 2 { // the second resume changes nothing
		back, err := s.Resume(ctx, tenant)
		if err != nil || back.Suspended != nil || back.SuspendReason != "" {
			t.Fatalf("Resume: %+v, %v", back, err)
		}
	}
	if listed() {
		t.Error("tenant_suspensions still lists the resumed tenant")
	}
	if p, err := s.Authenticate(ctx, full); err != nil || p.KeyID != k.ID {
		t.Errorf("key after resume: %+v, %v", p, err)
	}
	if _, err := s.Authenticate(ctx, revokedFull); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("revoked key after resume: %v, want ErrInvalidKey (still revoked)", err)
	}
	if _, err := s.Suspend(ctx, "no-such-tenant-ks", "x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Suspend of an unknown tenant: %v, want ErrNotFound", err)
	}
	if _, err := s.Resume(ctx, "no-such-tenant-ks"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Resume of an unknown tenant: %v, want ErrNotFound", err)
	}
}
