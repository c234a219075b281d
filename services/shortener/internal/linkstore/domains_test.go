//go:build integration

package linkstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// Concurrent registrations on PostgreSQL: one tenant's cannot pass its
// bound together (the per-tenant lock); of two tenants claiming one name
// and verifying it at once exactly one holds it, the other ErrDomainTaken.
func TestRegisterDomainConcurrently(t *testing.T) {
	s := New(connect(t, ""), 10*time.Second)
	ctx := context.Background()
	suffix := strings.ToLower(rand.Text()[:10])
	acme, other := "dom-a-"+suffix, "dom-b-"+suffix
	t.Cleanup(func() {
		_, _ = s.db.Exec(context.Background(), `DELETE FROM domains WHERE tenant = ANY($1)`, []string{acme, other})
	})

	const max, tries = 3, 12
	var wg sync.WaitGroup
	errs := make([]error, tries)
	for i := range tries {
		wg.Go(func() {
			_, _, errs[i] = s.RegisterDomain(ctx, acme, fmt.Sprintf("d%d.%s.test", i, suffix), "tok", max)
		})
	}
	wg.Wait()
	ok, limited := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrDomainLimit):
			limited++
		default:
			t.Errorf("register: %v", err)
		}
	}
	if ok != max || limited != tries-max {
		t.Errorf("%d registered and %d refused at the bound, want %d and %d", ok, limited, max, tries-max)
	}
	if ds, err := s.ListDomains(ctx, acme, 100); err != nil || len(ds) != max {
		t.Errorf("listed %d domains (%v), want %d", len(ds), err, max)
	}

	// Two tenants claim one name, and both verify at once: exactly one
	// holds it, the other is ErrDomainTaken and its claim is gone; a
	// later claim is ErrDomainTaken.
	name := "race." + suffix + ".test"
	racers := []string{acme + "-x", other}
	t.Cleanup(func() { _, _ = s.db.Exec(context.Background(), `DELETE FROM domains WHERE name = $1`, name) })
	for _, tenant := range racers {
		if _, created, err := s.RegisterDomain(ctx, tenant, name, "tok-"+tenant, max); err != nil || !created {
			t.Fatalf("%s's claim on %s: created %v, %v", tenant, name, created, err)
		}
	}
	won := make([]error, 2)
	for i, tenant := range racers {
		wg.Go(func() { _, won[i] = s.VerifyDomain(ctx, tenant, name, "admin") })
	}
	wg.Wait()
	if (won[0] == nil) == (won[1] == nil) || !errors.Is(errors.Join(won...), ErrDomainTaken) {
		t.Fatalf("two tenants verifying %s at once: %v", name, won)
	}
	winner, loser := racers[0], racers[1]
	if won[0] != nil {
		winner, loser = loser, winner
	}
	if d, err := s.GetDomain(ctx, winner, name); err != nil || d.Verified == nil {
		t.Errorf("the winner's domain: %+v %v", d, err)
	}
	if _, err := s.GetDomain(ctx, loser, name); !errors.Is(err, ErrDomainNotFound) {
		t.Errorf("the loser's claim after the other verified: %v, want ErrDomainNotFound", err)
	}
	if _, _, err := s.RegisterDomain(ctx, loser, name, "tok", max); !errors.Is(err, ErrDomainTaken) {
		t.Errorf("a claim on a verified name: %v, want ErrDomainTaken", err)
	}
	// Deleting one's own claim leaves another tenant's.
	shared := "shared." + suffix + ".test"
	t.Cleanup(func() { _, _ = s.db.Exec(context.Background(), `DELETE FROM domains WHERE name = $1`, shared) })
	for _, tenant := range racers {
		if _, _, err := s.RegisterDomain(ctx, tenant, shared, "tok", max); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteDomain(ctx, racers[0], shared); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetDomain(ctx, racers[1], shared); err != nil {
		t.Errorf("%s's claim after %s deleted its own: %v", racers[1], racers[0], err)
	}
}

// A link on a custom domain is stored with its domain under its key, and
// the schema refuses a key that does not match the domain.
func TestLinkDomainColumn(t *testing.T) {
	s := New(connect(t, ""), 10*time.Second)
	ctx := context.Background()
	suffix := strings.ToLower(rand.Text()[:10])
	tenant, domain := "dom-l-"+suffix, "go."+suffix+".test"
	t.Cleanup(func() { _, _ = s.db.Exec(context.Background(), `DELETE FROM links WHERE tenant = $1`, tenant) })
	l, err := s.Insert(ctx, Link{Code: domain + "/abcd", Domain: domain, Tenant: tenant, LongURL: "https://example.com/"})
	if err != nil || l.Domain != domain || l.Code != domain+"/abcd" {
		t.Fatalf("insert on a domain: %+v %v", l, err)
	}
	if got, err := s.Get(ctx, tenant, domain+"/abcd"); err != nil || got.Domain != domain {
		t.Errorf("get: %+v %v", got, err)
	}
	for _, bad := range []Link{
		{Code: "other.test/abcd", Domain: domain, Tenant: tenant, LongURL: "https://example.com/"},
		{Code: domain + "/efgh", Tenant: tenant, LongURL: "https://example.com/"},
	} {
		if _, err := s.Insert(ctx, bad); err == nil || !strings.Contains(err.Error(), "links_domain_key_check") {
			t.Errorf("insert %q on %q: %v, want the check's refusal", bad.Code, bad.Domain, err)
		}
	}
}
