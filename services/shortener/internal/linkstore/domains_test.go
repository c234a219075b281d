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
// bound together (the per-tenant lock), and of two tenants racing for one
// name exactly one gets it, the other ErrDomainTaken.
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

	name := "race." + suffix + ".test"
	won := make([]error, 2)
	for i, tenant := range []string{acme + "-x", other} {
		wg.Go(func() { _, _, won[i] = s.RegisterDomain(ctx, tenant, name, "tok", max) })
	}
	wg.Wait()
	t.Cleanup(func() { _, _ = s.db.Exec(context.Background(), `DELETE FROM domains WHERE name = $1`, name) })
	if (won[0] == nil) == (won[1] == nil) || !errors.Is(errors.Join(won...), ErrDomainTaken) {
		t.Errorf("two tenants racing for %s: %v", name, won)
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
