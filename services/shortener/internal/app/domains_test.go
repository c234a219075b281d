//go:build integration

package app

import (
	"context"
	"crypto/rand"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/servertest"
)

// fakeTXT answers TXT lookups from a map; a name it does not hold is "no
// such host", as DNS would answer.
type fakeTXT struct {
	mu      sync.Mutex
	records map[string][]string
}

func (f *fakeTXT) set(name string, values ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.records[name] = values
}

func (f *fakeTXT) LookupTXT(_ context.Context, name string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// An absolute name (trailing dot) is the same record, as in DNS.
	if v, ok := f.records[strings.TrimSuffix(name, ".")]; ok {
		return v, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
}

// startWithTXT is start with VerifyDomain asking txt.
func startWithTXT(t *testing.T, txt *fakeTXT, overrides map[string]string) instance {
	t.Helper()
	env := map[string]string{"KURZ_LIMITER_GRPC_ADDR": limitertest.Start(t, limitertest.AllowAll).Addr()}
	for k, v := range overrides {
		env[k] = v
	}
	cfg := load(t, env)
	cfg.TXT = txt
	srv, err := build(context.Background(), cfg, servertest.Logger(t), hooks{})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "kurz.shortener.v1.ShortenerService")
	return instance{Running: r, api: shortenerv1.NewShortenerServiceClient(r.Conn), cfg: cfg}
}

// testDomain is a fresh domain name under the reserved .test TLD.
func testDomain() string {
	return "go-" + strings.ToLower(rand.Text()[:10]) + ".acme.test"
}

// Custom domains end to end on the shortener: two tenants, registration
// (normalised, bounded; the first to verify a name holds it), verification by the TXT
// record through the resolver, links on the verified domain with codes
// unique per domain, and the other tenant kept out of everything.
func TestCustomDomains(t *testing.T) {
	txt := &fakeTXT{records: map[string][]string{}}
	sh := startWithTXT(t, txt, map[string]string{"KURZ_SHORTENER_MAX_DOMAINS": "2", "KURZ_SHORTENER_BASE_URL": "https://kurz.test"})
	acme, other := uniq("acme"), uniq("other")
	db, rdb := stores(t, sh.cfg, acme, other)
	t.Cleanup(func() {
		_, _ = db.Exec(context.Background(), `DELETE FROM domains WHERE tenant = ANY($1)`, []string{acme, other})
	})
	a, o := as(acme, "192.0.2.1"), as(other, "192.0.2.2")
	domain := testDomain()

	reg, err := sh.api.RegisterDomain(a, &shortenerv1.RegisterDomainRequest{Name: strings.ToUpper(domain) + "."})
	if err != nil {
		t.Fatal(err)
	}
	d := reg.GetDomain()
	if d.GetName() != domain || d.GetVerified() || d.GetTenant() != acme ||
		d.GetVerificationRecord() != "_kurz-challenge."+domain || !strings.HasPrefix(d.GetVerificationToken(), "kurz-verify=") {
		t.Fatalf("registered %+v", d)
	}
	again, err := sh.api.RegisterDomain(a, &shortenerv1.RegisterDomainRequest{Name: domain})
	if err != nil || again.GetDomain().GetVerificationToken() != d.GetVerificationToken() {
		t.Fatalf("registering again: %v %+v, want the same domain", err, again.GetDomain())
	}

	// Bad names, kurz's own domain, and the per-tenant bound.
	for _, bad := range []string{"", "localhost", "192.0.2.7", "[::1]", "a..b.test", "-x.test", "x_y.test", "kurz.test",
		strings.Repeat("a", 64) + ".test", strings.Repeat("abcdefghi.", 26) + "test"} {
		_, err := sh.api.RegisterDomain(a, &shortenerv1.RegisterDomainRequest{Name: bad})
		if reason, _ := wantStatus(t, err, codes.InvalidArgument); reason != "DOMAIN_INVALID" {
			t.Errorf("RegisterDomain(%q): reason %q, want DOMAIN_INVALID", bad, reason)
		}
	}
	if _, err := sh.api.RegisterDomain(a, &shortenerv1.RegisterDomainRequest{Name: testDomain()}); err != nil {
		t.Fatal(err)
	}
	_, err = sh.api.RegisterDomain(a, &shortenerv1.RegisterDomainRequest{Name: testDomain()})
	if reason, _ := wantStatus(t, err, codes.FailedPrecondition); reason != "DOMAIN_LIMIT" {
		t.Errorf("third domain: reason %q, want DOMAIN_LIMIT", reason)
	}

	// The other tenant cannot see acme's claim; while nobody has verified
	// the name it may claim it too, with a token of its own.
	_, err = sh.api.GetDomain(o, &shortenerv1.GetDomainRequest{Name: domain})
	wantStatus(t, err, codes.NotFound)
	_, err = sh.api.VerifyDomain(o, &shortenerv1.VerifyDomainRequest{Name: domain})
	wantStatus(t, err, codes.NotFound)
	if l, err := sh.api.ListDomains(o, &shortenerv1.ListDomainsRequest{}); err != nil || len(l.GetDomains()) != 0 {
		t.Errorf("other tenant lists %v %v, want none", l.GetDomains(), err)
	}
	oreg, err := sh.api.RegisterDomain(o, &shortenerv1.RegisterDomainRequest{Name: domain})
	if err != nil || oreg.GetDomain().GetTenant() != other || oreg.GetDomain().GetVerificationToken() == d.GetVerificationToken() {
		t.Fatalf("other's claim on acme's unverified name: %v %+v", err, oreg.GetDomain())
	}

	// Unverified: no links; a wrong record does not verify.
	_, err = sh.api.CreateLink(a, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/x", Domain: domain})
	if reason, _ := wantStatus(t, err, codes.InvalidArgument); reason != "DOMAIN_NOT_VERIFIED" {
		t.Errorf("link on an unverified domain: reason %q", reason)
	}
	_, err = sh.api.VerifyDomain(a, &shortenerv1.VerifyDomainRequest{Name: domain})
	if reason, _ := wantStatus(t, err, codes.FailedPrecondition); reason != "DOMAIN_NOT_VERIFIED" {
		t.Errorf("verify without a record: reason %q", reason)
	}
	txt.set("_kurz-challenge."+domain, "kurz-verify=someone-else")
	_, err = sh.api.VerifyDomain(a, &shortenerv1.VerifyDomainRequest{Name: domain})
	wantStatus(t, err, codes.FailedPrecondition)

	txt.set("_kurz-challenge."+domain, "v=spf1 -all", d.GetVerificationToken())
	ver, err := sh.api.VerifyDomain(a, &shortenerv1.VerifyDomainRequest{Name: domain})
	if err != nil {
		t.Fatal(err)
	}
	if !ver.GetDomain().GetVerified() || ver.GetDomain().GetVerifiedBy() != "dns" || ver.GetDomain().GetVerifyTime() == nil {
		t.Fatalf("verified %+v", ver.GetDomain())
	}
	// Verified by acme: other's claim is gone, and the name is taken,
	// without naming its holder.
	_, err = sh.api.GetDomain(o, &shortenerv1.GetDomainRequest{Name: domain})
	wantStatus(t, err, codes.NotFound)
	_, err = sh.api.RegisterDomain(o, &shortenerv1.RegisterDomainRequest{Name: domain})
	if _, st := wantStatus(t, err, codes.AlreadyExists); strings.Contains(st.Message(), acme) {
		t.Errorf("refusal names the holder: %q", st.Message())
	}

	// A link on the domain, and the same alias on the default domain: two
	// links, each with its short URL and its own cache entry.
	alias := uniq("dom")
	onDomain, err := sh.api.CreateLink(a, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/custom", CustomAlias: alias, Domain: strings.ToUpper(domain)})
	if err != nil {
		t.Fatal(err)
	}
	onDefault, err := sh.api.CreateLink(a, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/default", CustomAlias: alias})
	if err != nil {
		t.Fatal(err)
	}
	if l := onDomain.GetLink(); l.GetCode() != alias || l.GetDomain() != domain || l.GetShortUrl() != "https://"+domain+"/"+alias {
		t.Errorf("link on the domain: %+v", l)
	}
	if l := onDefault.GetLink(); l.GetCode() != alias || l.GetDomain() != "" || l.GetShortUrl() != "https://kurz.test/"+alias {
		t.Errorf("link on the default domain: %+v", l)
	}
	_, err = sh.api.CreateLink(a, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/again", CustomAlias: alias, Domain: domain})
	wantStatus(t, err, codes.AlreadyExists)
	seq, err := sh.api.CreateLink(a, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/seq", Domain: domain})
	if err != nil || seq.GetLink().GetDomain() != domain || !strings.HasPrefix(seq.GetLink().GetShortUrl(), "https://"+domain+"/") {
		t.Fatalf("sequential link on the domain: %v %+v", err, seq.GetLink())
	}
	// A batch: items on the domain (an alias taken there, one free), one on
	// a domain the tenant does not hold.
	batch, err := sh.api.BatchCreateLinks(a, &shortenerv1.BatchCreateLinksRequest{Requests: []*shortenerv1.CreateLinkRequest{
		{LongUrl: "https://example.com/b1", CustomAlias: alias, Domain: domain},
		{LongUrl: "https://example.com/b2", CustomAlias: alias + "b", Domain: domain},
		{LongUrl: "https://example.com/b3", Domain: domain},
		{LongUrl: "https://example.com/b4", Domain: testDomain()},
	}})
	if err != nil {
		t.Fatal(err)
	}
	r := batch.GetResults()
	if batch.GetCreated() != 2 || r[0].GetError().GetCode() != "ALREADY_EXISTS" || r[3].GetError().GetField() != "domain" ||
		r[1].GetLink().GetShortUrl() != "https://"+domain+"/"+alias+"b" || r[2].GetLink().GetDomain() != domain {
		t.Errorf("batch on the domain: %v", r)
	}
	for _, i := range []int{1, 2} {
		if _, err := sh.api.DeleteLink(a, &shortenerv1.DeleteLinkRequest{Code: r[i].GetLink().GetCode(), Domain: domain}); err != nil {
			t.Fatal(err)
		}
	}

	ctx := context.Background()
	for key, want := range map[string]string{domain + "/" + alias: "https://example.com/custom", alias: "https://example.com/default"} {
		e, found, err := linkcache.Get(ctx, rdb, key)
		if err != nil || !found || e.URL != want {
			t.Errorf("cache entry %q: %+v %v %v, want URL %s", key, e, found, err, want)
		}
	}
	got, err := sh.api.GetLink(a, &shortenerv1.GetLinkRequest{Code: alias, Domain: domain})
	if err != nil || got.GetLink().GetLongUrl() != "https://example.com/custom" {
		t.Errorf("GetLink on the domain: %v %+v", err, got.GetLink())
	}

	// The other tenant cannot use the domain, nor reach its links.
	_, err = sh.api.CreateLink(o, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/x", Domain: domain})
	if reason, _ := wantStatus(t, err, codes.InvalidArgument); reason != "DOMAIN_NOT_VERIFIED" {
		t.Errorf("other tenant's link on the domain: reason %q", reason)
	}
	_, err = sh.api.GetLink(o, &shortenerv1.GetLinkRequest{Code: alias, Domain: domain})
	wantStatus(t, err, codes.NotFound)

	// Codes from the URL are per domain: one URL on the domain and on the
	// default domain is two links, each returned again on its own domain,
	// the custom one keyed <domain>/<code>.
	fromURL := func(d string) *shortenerv1.CreateLinkResponse {
		t.Helper()
		resp, err := sh.api.CreateLink(a, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/from-url", Domain: d,
			Mode: shortenerv1.CodeMode_CODE_MODE_FROM_URL})
		if err != nil {
			t.Fatalf("from URL on %q: %v", d, err)
		}
		return resp
	}
	fu1, fd1 := fromURL(domain), fromURL("")
	fu2, fd2 := fromURL(domain), fromURL("")
	if !fu1.GetCreated() || !fd1.GetCreated() || fu2.GetCreated() || fd2.GetCreated() {
		t.Errorf("from URL created: domain %v then %v, default %v then %v; want true then false on each",
			fu1.GetCreated(), fu2.GetCreated(), fd1.GetCreated(), fd2.GetCreated())
	}
	if fu1.GetLink().GetDomain() != domain || fu2.GetLink().GetCode() != fu1.GetLink().GetCode() ||
		fd1.GetLink().GetDomain() != "" || fd2.GetLink().GetCode() != fd1.GetLink().GetCode() {
		t.Errorf("from URL: domain %+v / %+v, default %+v / %+v", fu1.GetLink(), fu2.GetLink(), fd1.GetLink(), fd2.GetLink())
	}
	if e, found, err := linkcache.Get(context.Background(), rdb, domain+"/"+fu1.GetLink().GetCode()); err != nil || !found || e.URL != "https://example.com/from-url" {
		t.Errorf("from-URL link on the domain: cache entry %+v %v %v", e, found, err)
	}
	for _, l := range []*shortenerv1.Link{fu1.GetLink(), fd1.GetLink()} {
		if _, err := sh.api.DeleteLink(a, &shortenerv1.DeleteLinkRequest{Code: l.GetCode(), Domain: l.GetDomain()}); err != nil {
			t.Fatal(err)
		}
	}

	// A domain with live links is not deleted; without, it is.
	_, err = sh.api.DeleteDomain(a, &shortenerv1.DeleteDomainRequest{Name: domain})
	if reason, _ := wantStatus(t, err, codes.FailedPrecondition); reason != "DOMAIN_IN_USE" {
		t.Errorf("delete with links: reason %q", reason)
	}
	for _, code := range []string{alias, seq.GetLink().GetCode()} {
		if _, err := sh.api.DeleteLink(a, &shortenerv1.DeleteLinkRequest{Code: code, Domain: domain}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sh.api.GetLink(a, &shortenerv1.GetLinkRequest{Code: alias}); err != nil {
		t.Errorf("the default domain's link went with the other: %v", err)
	}
	if _, err := sh.api.DeleteDomain(a, &shortenerv1.DeleteDomainRequest{Name: domain}); err != nil {
		t.Fatal(err)
	}
	_, err = sh.api.GetDomain(a, &shortenerv1.GetDomainRequest{Name: domain})
	wantStatus(t, err, codes.NotFound)
}

// ApproveDomain verifies without DNS (the administrator's route calls it
// as the tenant), and VerifyDomain without a resolver configured refuses.
func TestApproveDomain(t *testing.T) {
	sh := startWithTXT(t, &fakeTXT{records: map[string][]string{}}, nil)
	acme := uniq("acme")
	db, _ := stores(t, sh.cfg, acme)
	t.Cleanup(func() { _, _ = db.Exec(context.Background(), `DELETE FROM domains WHERE tenant = $1`, acme) })
	a := as(acme, "192.0.2.1")
	domain := testDomain()
	if _, err := sh.api.RegisterDomain(a, &shortenerv1.RegisterDomainRequest{Name: domain}); err != nil {
		t.Fatal(err)
	}
	resp, err := sh.api.ApproveDomain(a, &shortenerv1.ApproveDomainRequest{Name: domain})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetDomain().GetVerified() || resp.GetDomain().GetVerifiedBy() != "admin" {
		t.Errorf("approved: %+v", resp.GetDomain())
	}
	if _, err := sh.api.CreateLink(a, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/x", Domain: domain}); err != nil {
		t.Errorf("link on an approved domain: %v", err)
	}
}
