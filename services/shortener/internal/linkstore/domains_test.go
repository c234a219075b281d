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

	"kurz.dev/pkg/testkit/servertest"
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
	if verified, err := s.DeleteDomain(ctx, racers[0], shared); err != nil || verified {
		t.Fatalf("delete of an unverified claim: verified %v, %v; want false", verified, err)
	}
	if _, err := s.GetDomain(ctx, racers[1], shared); err != nil {
		t.Errorf("%s's claim after %s deleted its own: %v", racers[1], racers[0], err)
	}
	// The race's winner deletes a verified domain (no links on it).
	if verified, err := s.DeleteDomain(ctx, winner, name); err != nil || !verified {
		t.Errorf("delete of a verified domain: verified %v, %v; want true", verified, err)
	}
}

// A link on a custom domain is stored with its domain under its key, and
// the schema refuses a key that does not match the domain.
// Served names the verified domains among its names, whoever holds them.
func TestServedNamesVerifiedDomainsOnly(t *testing.T) {
	s := New(connect(t, ""), 10*time.Second)
	ctx := context.Background()
	suffix := strings.ToLower(rand.Text()[:10])
	acme, other := "srv-a-"+suffix, "srv-b-"+suffix
	t.Cleanup(func() {
		_, _ = s.db.Exec(context.Background(), `DELETE FROM domains WHERE tenant = ANY($1)`, []string{acme, other})
	})
	verified, pending, theirs := "v."+suffix+".test", "p."+suffix+".test", "o."+suffix+".test"
	for _, d := range []struct{ tenant, name string }{{acme, verified}, {acme, pending}, {other, theirs}} {
		if _, _, err := s.RegisterDomain(ctx, d.tenant, d.name, "tok", 10); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []struct{ tenant, name string }{{acme, verified}, {other, theirs}} {
		if _, err := s.VerifyDomain(ctx, d.tenant, d.name, "admin"); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Served(ctx, []string{verified, pending, theirs, "none." + suffix + ".test"})
	if err != nil || len(got) != 2 || !got[verified] || !got[theirs] {
		t.Errorf("Served: %v, %v; want %s and %s", got, err, verified, theirs)
	}
	if got, err := s.Served(ctx, nil); err != nil || len(got) != 0 {
		t.Errorf("Served of no names: %v, %v", got, err)
	}

	// Insert refuses, in its one statement, a link whose RefuseHosts hold
	// a served domain (ErrHostServed, nothing stored); a pending or
	// unknown one is stored; a taken code with no served host stays
	// ErrCodeTaken.
	t.Cleanup(func() {
		_, _ = s.db.Exec(context.Background(), `DELETE FROM links WHERE tenant = $1`, acme)
	})
	link := func(code string, hosts ...string) Link {
		return Link{Code: "srv" + suffix + code, Tenant: acme, LongURL: "https://" + hosts[0] + "/x", RefuseHosts: hosts}
	}
	if _, err := s.Insert(ctx, link("1", "example.com", theirs)); !errors.Is(err, ErrHostServed) {
		t.Errorf("insert to another tenant's served domain: %v, want ErrHostServed", err)
	}
	if _, err := s.Get(ctx, acme, "srv"+suffix+"1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a link refused for a served host was stored: %v", err)
	}
	if _, err := s.Insert(ctx, link("2", pending, "none."+suffix+".test")); err != nil {
		t.Errorf("insert to a pending domain: %v, want it stored", err)
	}
	if _, err := s.Insert(ctx, link("2", "example.com")); !errors.Is(err, ErrCodeTaken) {
		t.Errorf("insert of a taken code: %v, want ErrCodeTaken", err)
	}
	if _, err := s.Insert(ctx, link("2", verified)); !errors.Is(err, ErrHostServed) {
		t.Errorf("insert of a taken code to a served domain: %v, want ErrHostServed", err)
	}
}

func TestLinkDomainColumn(t *testing.T) {
	s := New(connect(t, ""), 10*time.Second)
	ctx := context.Background()
	suffix := strings.ToLower(rand.Text()[:10])
	tenant, domain := "dom-l-"+suffix, "go."+suffix+".test"
	t.Cleanup(func() {
		_, _ = s.db.Exec(context.Background(), `DELETE FROM links WHERE tenant = $1`, tenant)
		_, _ = s.db.Exec(context.Background(), `DELETE FROM domains WHERE tenant = $1`, tenant)
	})
	if _, err := s.Insert(ctx, Link{Code: domain + "/zzzz", Domain: domain, Tenant: tenant, LongURL: "https://example.com/"}); !errors.Is(err, ErrDomainGone) {
		t.Errorf("insert on a domain the tenant has not verified: %v, want ErrDomainGone", err)
	}
	if _, _, err := s.RegisterDomain(ctx, tenant, domain, "tok", 10); err != nil {
		t.Fatal(err)
	}
	if _, err := s.VerifyDomain(ctx, tenant, domain, "admin"); err != nil {
		t.Fatal(err)
	}
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

// A link created while its domain is deleted: the insert and DeleteDomain
// meet on the domain's row, so the link is either there before the delete
// counts the domain's links (DOMAIN_IN_USE) or finds the domain gone
// (ErrDomainGone); never a link on a domain nobody holds.
func TestLinkInsertAndDomainDeleteMeetOnTheDomain(t *testing.T) {
	s := New(connect(t, ""), 10*time.Second)
	ctx := context.Background()
	suffix := strings.ToLower(rand.Text()[:10])
	tenant := "dom-race-" + suffix
	t.Cleanup(func() {
		_, _ = s.db.Exec(context.Background(), `DELETE FROM links WHERE tenant = $1`, tenant)
		_, _ = s.db.Exec(context.Background(), `DELETE FROM domains WHERE tenant = $1`, tenant)
	})
	verified := func(name string) {
		t.Helper()
		if _, _, err := s.RegisterDomain(ctx, tenant, name, "tok", 10); err != nil {
			t.Fatal(err)
		}
		if _, err := s.VerifyDomain(ctx, tenant, name, "admin"); err != nil {
			t.Fatal(err)
		}
	}
	// waitBlocked returns once a statement of another session waits for a
	// lock (the call started in the background has reached the row).
	waitBlocked := func(what string) {
		t.Helper()
		if !servertest.Eventually(10*time.Second, func() bool {
			var n int
			err := s.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n)
			return err == nil && n > 0
		}) {
			t.Fatalf("%s never waited for the domain's lock", what)
		}
	}

	// A delete under way (its row lock held): the insert waits, then finds
	// the domain gone.
	gone := "gone." + suffix + ".test"
	verified(gone)
	del, err := s.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = del.Rollback(ctx) }()
	if _, err := del.Exec(ctx, `DELETE FROM domains WHERE name = $1 AND tenant = $2`, gone, tenant); err != nil {
		t.Fatal(err)
	}
	inserted := make(chan error, 1)
	go func() {
		_, err := s.Insert(ctx, Link{Code: gone + "/a", Tenant: tenant, LongURL: "https://example.com/a", Domain: gone})
		inserted <- err
	}()
	waitBlocked("the insert")
	if err := del.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-inserted; !errors.Is(err, ErrDomainGone) {
		t.Errorf("insert on a domain deleted meanwhile: %v, want ErrDomainGone", err)
	}

	// An insert under way (holding the domain as lockDomains does, its
	// link not committed): the delete waits, then counts the link.
	held := "held." + suffix + ".test"
	verified(held)
	ins, err := s.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ins.Rollback(ctx) }()
	if err := lockDomains(ctx, ins, []Link{{Tenant: tenant, Domain: held}}); err != nil {
		t.Fatal(err)
	}
	if _, err := insert(ctx, ins, Link{Code: held + "/b", Tenant: tenant, LongURL: "https://example.com/b", Domain: held}); err != nil {
		t.Fatal(err)
	}
	deleted := make(chan error, 1)
	go func() { _, err := s.DeleteDomain(ctx, tenant, held); deleted <- err }()
	waitBlocked("the delete")
	if err := ins.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-deleted; !errors.Is(err, ErrDomainInUse) {
		t.Errorf("delete of a domain a link was being created on: %v, want ErrDomainInUse", err)
	}
}
