package linkapi_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkdomain"
	"kurz.dev/services/shortener/internal/linkapi"
	"kurz.dev/services/shortener/internal/linkstore"
	"kurz.dev/services/shortener/internal/linkstore/linkstoretest"
	"kurz.dev/services/shortener/internal/urlcheck"
)

// fakeDomains is an in-memory DomainStore with linkstore's answers: claims
// by name and tenant; the first tenant to verify a name holds it.
type fakeDomains struct {
	mu sync.Mutex
	m  map[string]map[string]linkstore.Domain // name, tenant
}

// verified is name's verified claim, if any (f.mu held).
func (f *fakeDomains) verified(name string) (linkstore.Domain, bool) {
	for _, d := range f.m[name] {
		if d.Verified != nil {
			return d, true
		}
	}
	return linkstore.Domain{}, false
}

func (f *fakeDomains) RegisterDomain(_ context.Context, tenant, name, token string, max int) (linkstore.Domain, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d, ok := f.m[name][tenant]; ok {
		return d, false, nil
	}
	if _, ok := f.verified(name); ok {
		return linkstore.Domain{}, false, linkstore.ErrDomainTaken
	}
	n := 0
	for _, claims := range f.m {
		if _, ok := claims[tenant]; ok {
			n++
		}
	}
	if n >= max {
		return linkstore.Domain{}, false, linkstore.ErrDomainLimit
	}
	d := linkstore.Domain{Name: name, Tenant: tenant, Token: token, Created: time.Now()}
	if f.m[name] == nil {
		f.m[name] = map[string]linkstore.Domain{}
	}
	f.m[name][tenant] = d
	return d, true, nil
}

func (f *fakeDomains) GetDomain(_ context.Context, tenant, name string) (linkstore.Domain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d, ok := f.m[name][tenant]; ok {
		return d, nil
	}
	return linkstore.Domain{}, linkstore.ErrDomainNotFound
}

func (f *fakeDomains) ListDomains(_ context.Context, tenant string, _ int) ([]linkstore.Domain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []linkstore.Domain
	for _, claims := range f.m {
		if d, ok := claims[tenant]; ok {
			out = append(out, d)
		}
	}
	return out, nil
}

func (f *fakeDomains) VerifyDomain(_ context.Context, tenant, name, by string) (linkstore.Domain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.m[name][tenant]
	if !ok {
		return linkstore.Domain{}, linkstore.ErrDomainNotFound
	}
	if v, ok := f.verified(name); ok && v.Tenant != tenant {
		return linkstore.Domain{}, linkstore.ErrDomainTaken
	}
	if d.Verified == nil {
		now := time.Now()
		d.Verified, d.VerifiedBy = &now, by
	}
	f.m[name] = map[string]linkstore.Domain{tenant: d}
	return d, nil
}

func (f *fakeDomains) DeleteDomain(_ context.Context, tenant, name string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.m[name][tenant]
	if !ok {
		return false, linkstore.ErrDomainNotFound
	}
	delete(f.m[name], tenant)
	return d.Verified != nil, nil
}

func (f *fakeDomains) Served(_ context.Context, names []string) (map[string]bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	served := map[string]bool{}
	for _, n := range names {
		if _, ok := f.verified(n); ok {
			served[n] = true
		}
	}
	return served, nil
}

// txtAnswer is what the fake resolver answers for every name.
type txtAnswer struct {
	mu     sync.Mutex
	values []string
	err    error
	asked  []string
}

func (r *txtAnswer) LookupTXT(_ context.Context, name string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, name)
	return r.values, r.err
}

func (r *txtAnswer) set(values []string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.values, r.err = values, err
}

func domainEnv(t *testing.T, txt *txtAnswer) *env {
	return newEnvWith(t, func(d *linkapi.Deps) {
		domains := &fakeDomains{m: map[string]map[string]linkstore.Domain{}}
		d.Domains = domains
		// The links store refuses served hosts at insert, as PostgreSQL's
		// reads its domains table.
		d.Store.(*linkstoretest.Fake).Served = func(hosts []string) bool {
			served, _ := domains.Served(context.Background(), hosts)
			return len(served) > 0
		}
		if txt != nil {
			d.TXT = txt
		}
	}, func(o *linkapi.Options) {
		o.MaxDomains, o.OwnHosts, o.DNSTimeout = 3, []string{"kurz.test"}, time.Second
	})
}

// VerifyDomain asks the resolver for _kurz-challenge.<domain> and verifies
// only on the domain's token among the record's values; "no such record"
// is FAILED_PRECONDITION, a failed lookup UNAVAILABLE.
func TestVerifyDomainByTXT(t *testing.T) {
	txt := &txtAnswer{}
	e := domainEnv(t, txt)
	ctx := as("acme")
	reg, err := e.client.RegisterDomain(ctx, &shortenerv1.RegisterDomainRequest{Name: "Go.Acme.Example."})
	if err != nil {
		t.Fatal(err)
	}
	d := reg.GetDomain()
	if d.GetName() != "go.acme.example" || d.GetVerificationRecord() != "_kurz-challenge.go.acme.example" {
		t.Fatalf("registered %+v", d)
	}
	verify := func() error {
		_, err := e.client.VerifyDomain(ctx, &shortenerv1.VerifyDomainRequest{Name: "go.acme.example"})
		return err
	}
	txt.set(nil, &net.DNSError{Err: "no such host", IsNotFound: true})
	wantStatus(t, "no record", verify(), codes.FailedPrecondition, linkapi.ReasonDomainNotVerified, "")
	txt.set(nil, &net.DNSError{Err: "i/o timeout", IsTimeout: true})
	wantStatus(t, "lookup failed", verify(), codes.Unavailable, linkapi.ReasonDNSUnavailable, "")
	txt.set(nil, errors.New("server misbehaving"))
	wantStatus(t, "lookup error", verify(), codes.Unavailable, linkapi.ReasonDNSUnavailable, "")
	txt.set([]string{"v=spf1 -all", d.GetVerificationToken() + "x"}, nil)
	wantStatus(t, "another value", verify(), codes.FailedPrecondition, linkapi.ReasonDomainNotVerified, "")
	txt.set([]string{"v=spf1 -all", " " + d.GetVerificationToken() + " "}, nil)
	if err := verify(); err != nil {
		t.Fatalf("verify with the token: %v", err)
	}
	// Absolute: the resolver's search list never completes the name.
	if txt.asked[0] != "_kurz-challenge.go.acme.example." {
		t.Errorf("looked up %q, want the absolute name _kurz-challenge.go.acme.example.", txt.asked[0])
	}
	got, err := e.client.GetDomain(ctx, &shortenerv1.GetDomainRequest{Name: "go.acme.example"})
	if err != nil || !got.GetDomain().GetVerified() || got.GetDomain().GetVerifiedBy() != "dns" {
		t.Errorf("after verification: %+v %v", got.GetDomain(), err)
	}
	// A verified domain stays verified: no lookup.
	n := len(txt.asked)
	txt.set(nil, errors.New("down"))
	if err := verify(); err != nil || len(txt.asked) != n {
		t.Errorf("verify again: %v, %d lookups more", err, len(txt.asked)-n)
	}

	l, err := e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/x", CustomAlias: "spring", Domain: "GO.acme.example"})
	if err != nil {
		t.Fatal(err)
	}
	if l.GetLink().GetShortUrl() != "https://go.acme.example/spring" || l.GetLink().GetDomain() != "go.acme.example" || l.GetLink().GetCode() != "spring" {
		t.Errorf("link on the domain: %+v", l.GetLink())
	}
	if got, err := e.store.Get(context.Background(), "acme", "go.acme.example/spring"); err != nil || got.Domain != "go.acme.example" {
		t.Errorf("the store's link keyed go.acme.example/spring: %+v %v", got, err)
	}
}

// Names are validated before any I/O, kurz's own host is refused, the
// per-tenant bound holds, a name nobody has verified can be claimed by
// several tenants and the first to verify holds it (the others' claims
// go, and a name verified by another tenant is refused without naming
// it), and links take only the caller's verified domains.
func TestDomainRules(t *testing.T) {
	e := domainEnv(t, nil)
	a, b := as("acme"), as("other")
	// The longest name whose challenge record still fits 253 characters
	// registers; one more character could never be verified.
	longest := strings.Repeat(strings.Repeat("a", 62)+".", 3) + strings.Repeat("b", linkdomain.MaxRegistered-3*63-8) + ".example"
	if _, err := e.client.RegisterDomain(b, &shortenerv1.RegisterDomainRequest{Name: longest}); err != nil {
		t.Errorf("register a name of %d characters: %v", len(longest), err)
	}
	if _, err := e.client.DeleteDomain(b, &shortenerv1.DeleteDomainRequest{Name: longest}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", "kurz.test", "KURZ.TEST.", "127.0.0.1", "a..b", "x", "c" + longest,
		"0x7f.0x0.0x0.0x1", "go.0x7f", "x.localhost", "localhost.localdomain", "go.acme.internal", "printer.home.arpa"} {
		_, err := e.client.RegisterDomain(a, &shortenerv1.RegisterDomainRequest{Name: name})
		wantStatus(t, "register "+name, err, codes.InvalidArgument, linkapi.ReasonDomainInvalid, "name")
	}
	for _, name := range []string{"a.example", "b.example", "c.example"} {
		if _, err := e.client.RegisterDomain(a, &shortenerv1.RegisterDomainRequest{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := e.client.RegisterDomain(a, &shortenerv1.RegisterDomainRequest{Name: "d.example"})
	wantStatus(t, "a fourth domain", err, codes.FailedPrecondition, linkapi.ReasonDomainLimit, "")
	// A claim alone does not lock the name: other holds one too, with its
	// own token, and sees only its own.
	claim, err := e.client.RegisterDomain(b, &shortenerv1.RegisterDomainRequest{Name: "a.example"})
	if err != nil || claim.GetDomain().GetTenant() != "other" || claim.GetDomain().GetVerified() {
		t.Fatalf("other's claim on acme's unverified name: %v %+v", err, claim.GetDomain())
	}
	// Without a resolver only an administrator verifies.
	_, err = e.client.VerifyDomain(a, &shortenerv1.VerifyDomainRequest{Name: "a.example"})
	wantStatus(t, "verify without a resolver", err, codes.FailedPrecondition, linkapi.ReasonDomainNotVerified, "")
	for _, c := range []struct {
		ctx    context.Context
		domain string
	}{{a, "b.example"}, {b, "a.example"}, {a, "nobody.example"}, {a, "not a domain"}} {
		_, err := e.client.CreateLink(c.ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/", Domain: c.domain})
		wantStatus(t, "link on "+c.domain, err, codes.InvalidArgument, linkapi.ReasonDomainNotVerified, "domain")
	}
	if _, err := e.client.ApproveDomain(a, &shortenerv1.ApproveDomainRequest{Name: "a.example"}); err != nil {
		t.Fatal(err)
	}
	// Verified by acme: other's claim is gone, and the name is taken.
	_, err = e.client.GetDomain(b, &shortenerv1.GetDomainRequest{Name: "a.example"})
	wantStatus(t, "other's claim after acme verified", err, codes.NotFound, "", "")
	_, err = e.client.RegisterDomain(b, &shortenerv1.RegisterDomainRequest{Name: "a.example"})
	wantStatus(t, "another tenant's verified domain", err, codes.AlreadyExists, linkapi.ReasonDomainTaken, "")
	_, err = e.client.CreateLink(b, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/", Domain: "a.example"})
	wantStatus(t, "another tenant's verified domain", err, codes.InvalidArgument, linkapi.ReasonDomainNotVerified, "domain")
	if _, err := e.client.CreateLink(a, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/", Domain: "a.example"}); err != nil {
		t.Errorf("link on an approved domain: %v", err)
	}
}

// A domain written in Unicode is the punycode name DNS and browsers use:
// registered, answered and found as that name, whichever way it is
// spelt; a look-alike of kurz's own host is kurz's own host.
func TestAUnicodeDomainIsItsPunycodeName(t *testing.T) {
	e := domainEnv(t, nil)
	a := as("acme")
	const name = "xn--bcher-kva.example"
	reg, err := e.client.RegisterDomain(a, &shortenerv1.RegisterDomainRequest{Name: "Bücher.example"})
	if err != nil || reg.GetDomain().GetName() != name {
		t.Fatalf("register Bücher.example: %v %v; want %s", reg.GetDomain(), err, name)
	}
	if _, err := e.client.ApproveDomain(a, &shortenerv1.ApproveDomainRequest{Name: "bücher.example."}); err != nil {
		t.Fatal(err)
	}
	l, err := e.client.CreateLink(a, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/idn", Domain: "BÜCHER.example"})
	if err != nil || l.GetLink().GetDomain() != name || l.GetLink().GetShortUrl() != "https://"+name+"/"+l.GetLink().GetCode() {
		t.Fatalf("link on BÜCHER.example: %v %v; want it on %s", l.GetLink(), err, name)
	}
	got, err := e.client.GetLink(a, &shortenerv1.GetLinkRequest{Code: l.GetLink().GetCode(), Domain: "bücher.example"})
	if err != nil || got.GetLink().GetLongUrl() != "https://example.com/idn" {
		t.Errorf("get the link by bücher.example: %v %v", got, err)
	}
	_, err = e.client.RegisterDomain(a, &shortenerv1.RegisterDomainRequest{Name: "ｋｕｒｚ．ｔｅｓｔ"})
	wantStatus(t, "register a full-width kurz.test", err, codes.InvalidArgument, linkapi.ReasonDomainInvalid, "name")
}

// kurz's own host, as a client sends back the host of a short URL, names
// the default domain of a new link (any case, a trailing dot or a port
// alike), one at a time and in a batch; no tenant can register it.
func TestOwnHostNamesTheDefaultDomain(t *testing.T) {
	e := domainEnv(t, nil)
	for _, name := range []string{"kurz.test", "KURZ.TEST.", "kurz.test:8443"} {
		l, err := e.client.CreateLink(as("acme"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/" + name, Domain: name})
		if err != nil || l.GetLink().Domain != nil || !strings.HasPrefix(l.GetLink().GetShortUrl(), "https://kurz.test/") {
			t.Errorf("link on %q: %+v %v; want a default-domain link", name, l.GetLink(), err)
		}
	}
	b, err := e.client.BatchCreateLinks(as("acme"), &shortenerv1.BatchCreateLinksRequest{Requests: []*shortenerv1.CreateLinkRequest{
		{LongUrl: "https://example.com/batch", Domain: "kurz.test"}}})
	if err != nil || len(b.GetResults()) != 1 || b.GetResults()[0].GetLink() == nil || b.GetResults()[0].GetLink().Domain != nil {
		t.Errorf("batch link on kurz.test: %v %v; want a default-domain link", b, err)
	}
}

// Without a domain store the domain RPCs are UNIMPLEMENTED and links take
// no domain; default-domain links are unaffected.
func TestDomainsDisabled(t *testing.T) {
	e := newEnv(t)
	_, err := e.client.RegisterDomain(as("acme"), &shortenerv1.RegisterDomainRequest{Name: "go.acme.example"})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("RegisterDomain without a store: %v, want UNIMPLEMENTED", err)
	}
	_, err = e.client.CreateLink(as("acme"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/", Domain: "go.acme.example"})
	wantStatus(t, "link on a domain", err, codes.InvalidArgument, linkapi.ReasonDomainNotVerified, "domain")
	l, err := e.client.CreateLink(as("acme"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/"})
	if err != nil || l.GetLink().Domain != nil {
		t.Errorf("default-domain link: %+v %v (domain must be absent)", l.GetLink(), err)
	}
}

// A link on a custom domain may not send visitors back to that domain
// (the redirect serves it): create, batch and update refuse it as they
// refuse kurz's own hosts, URL_REDIRECT_LOOP on the field.
func TestLinkOnACustomDomainMayNotTargetIt(t *testing.T) {
	txt := &txtAnswer{}
	e := domainEnv(t, txt)
	ctx := as("acme")
	reg, err := e.client.RegisterDomain(ctx, &shortenerv1.RegisterDomainRequest{Name: "go.acme.example"})
	if err != nil {
		t.Fatal(err)
	}
	txt.set([]string{reg.GetDomain().GetVerificationToken()}, nil)
	if _, err := e.client.VerifyDomain(ctx, &shortenerv1.VerifyDomainRequest{Name: "go.acme.example"}); err != nil {
		t.Fatal(err)
	}
	_, err = e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://GO.acme.example/loop", CustomAlias: "loop", Domain: "go.acme.example"})
	wantStatus(t, "a link to its own domain", err, codes.InvalidArgument, urlcheck.ReasonLoop, "long_url")
	_, err = e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/", Domain: "go.acme.example",
		DeviceTargets: &shortenerv1.DeviceTargets{IosUrl: "https://go.acme.example/ios"}})
	wantStatus(t, "a device target on its own domain", err, codes.InvalidArgument, urlcheck.ReasonLoop, "device_targets.ios_url")
	batch, err := e.client.BatchCreateLinks(ctx, &shortenerv1.BatchCreateLinksRequest{Requests: []*shortenerv1.CreateLinkRequest{
		{LongUrl: "https://go.acme.example/b", Domain: "go.acme.example"},
		{LongUrl: "https://example.com/b", Domain: "go.acme.example"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if r := batch.GetResults(); r[0].GetError().GetField() != "long_url" || r[1].GetError() != nil {
		t.Errorf("batch results %v, want the first refused on long_url and the second created", r)
	}
	ok, err := e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/ok", CustomAlias: "fine", Domain: "go.acme.example"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.client.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
		Link:       &shortenerv1.Link{Code: ok.GetLink().GetCode(), Domain: proto.String("go.acme.example"), LongUrl: "https://go.acme.example/fine"},
		UpdateMask: mask("long_url"),
	})
	wantStatus(t, "an update to its own domain", err, codes.InvalidArgument, urlcheck.ReasonLoop, "long_url")
	// Rules and variants are destinations too.
	_, err = e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/", Domain: "go.acme.example",
		Variants: []*shortenerv1.Variant{{Name: "a", Url: "https://example.com/a", Weight: 1}, {Name: "b", Url: "https://go.acme.example./b", Weight: 1}}})
	wantStatus(t, "a variant on its own domain", err, codes.InvalidArgument, urlcheck.ReasonLoop, "variants[1].url")
	_, err = e.client.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
		Link: &shortenerv1.Link{Code: ok.GetLink().GetCode(), Domain: proto.String("go.acme.example"),
			Rules: []*shortenerv1.RedirectRule{{Name: "ios", Conditions: []*shortenerv1.RuleCondition{{Devices: []string{"ios"}}}, Url: "https://GO.acme.example/r"}}},
		UpdateMask: mask("rules"),
	})
	wantStatus(t, "a rule updated to its own domain", err, codes.InvalidArgument, urlcheck.ReasonLoop, "rules[0].url")
	// Another host of the same registrable domain is not the link's own.
	if _, err := e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://www.acme.example/", Domain: "go.acme.example"}); err != nil {
		t.Errorf("a link to another host of the domain: %v", err)
	}
}

// No link may send its visitors to a custom domain the redirect serves,
// whoever verified it: two links on two domains, each to the other, were
// an endless loop served by kurz. Create, batch and update refuse it on
// the field; a domain registered but not verified is not served, and not
// refused.
func TestLinkMayNotTargetAnyServedDomain(t *testing.T) {
	txt := &txtAnswer{}
	e := domainEnv(t, txt)
	verify := func(tenant, name string) {
		t.Helper()
		reg, err := e.client.RegisterDomain(as(tenant), &shortenerv1.RegisterDomainRequest{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		txt.set([]string{reg.GetDomain().GetVerificationToken()}, nil)
		if _, err := e.client.VerifyDomain(as(tenant), &shortenerv1.VerifyDomainRequest{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	verify("acme", "gox.acme.example")
	verify("acme", "goy.acme.example")
	verify("other", "go.other.example")
	if _, err := e.client.RegisterDomain(as("acme"), &shortenerv1.RegisterDomainRequest{Name: "pending.acme.example"}); err != nil {
		t.Fatal(err)
	}
	ctx := as("acme")
	_, err := e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://GOY.acme.example/loopb", CustomAlias: "loopa", Domain: "gox.acme.example"})
	wantStatus(t, "a link on one domain to another", err, codes.InvalidArgument, urlcheck.ReasonLoop, "long_url")
	_, err = e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/",
		Variants: []*shortenerv1.Variant{{Name: "a", Url: "https://example.com/a", Weight: 1}, {Name: "b", Url: "https://go.other.example/x", Weight: 1}}})
	wantStatus(t, "a default-domain link to another tenant's domain", err, codes.InvalidArgument, urlcheck.ReasonLoop, "variants[1].url")
	batch, err := e.client.BatchCreateLinks(ctx, &shortenerv1.BatchCreateLinksRequest{Requests: []*shortenerv1.CreateLinkRequest{
		{LongUrl: "https://gox.acme.example/a", CustomAlias: "bad1"},
		{LongUrl: "https://pending.acme.example/", CustomAlias: "fine2"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if r := batch.GetResults(); r[0].GetError().GetField() != "long_url" || r[1].GetError() != nil || batch.GetCreated() != 1 {
		t.Errorf("batch results %v, want the first refused on long_url, the second (an unverified domain) created", r)
	}
	if _, err := e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/fine", CustomAlias: "fine1"}); err != nil {
		t.Fatal(err)
	}
	// A refused item takes no alias from a later one of the batch.
	batch, err = e.client.BatchCreateLinks(ctx, &shortenerv1.BatchCreateLinksRequest{Requests: []*shortenerv1.CreateLinkRequest{
		{LongUrl: "https://goy.acme.example/a", CustomAlias: "same1"},
		{LongUrl: "https://example.com/same", CustomAlias: "same1"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if r := batch.GetResults(); r[0].GetError().GetField() != "long_url" || r[1].GetError() != nil || r[1].GetLink().GetCode() != "same1" {
		t.Errorf("batch results %v, want the first refused and the second created with the alias", r)
	}
	_, err = e.client.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
		Link:       &shortenerv1.Link{Code: "fine1", LongUrl: "https://go.other.example/"},
		UpdateMask: mask("long_url"),
	})
	wantStatus(t, "an update to a served domain", err, codes.InvalidArgument, urlcheck.ReasonLoop, "long_url")
}

// The redirect pods re-read every verified domain on each message of
// linkdomain.ChangedChannel, so only a change of what they serve is
// published: a verification, an approval and the deletion of a verified
// domain; registering and deleting claims, or verifying again, is not.
func TestDomainChangesPublishedOnlyWhenServedSetChanges(t *testing.T) {
	txt := &txtAnswer{}
	e := domainEnv(t, txt)
	ctx := as("acme")
	published := func() []string {
		e.cache.mu.Lock()
		defer e.cache.mu.Unlock()
		return slices.Clone(e.cache.onChannel[linkdomain.ChangedChannel])
	}
	want := func(step string, names ...string) {
		t.Helper()
		if got := published(); !slices.Equal(got, names) {
			t.Errorf("after %s: published %q on %s, want %q", step, got, linkdomain.ChangedChannel, names)
		}
	}
	register := func(name string) *shortenerv1.Domain {
		t.Helper()
		reg, err := e.client.RegisterDomain(ctx, &shortenerv1.RegisterDomainRequest{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return reg.GetDomain()
	}
	del := func(name string) {
		t.Helper()
		if _, err := e.client.DeleteDomain(ctx, &shortenerv1.DeleteDomainRequest{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		register("claim.acme.example")
		del("claim.acme.example")
	}
	want("registering and deleting a claim three times")

	register("approved.acme.example")
	for range 2 {
		if _, err := e.client.ApproveDomain(ctx, &shortenerv1.ApproveDomainRequest{Name: "approved.acme.example"}); err != nil {
			t.Fatal(err)
		}
	}
	want("approving twice", "approved.acme.example")
	del("approved.acme.example")
	want("deleting the approved domain", "approved.acme.example", "approved.acme.example")

	d := register("dns.acme.example")
	txt.set([]string{d.GetVerificationToken()}, nil)
	for range 2 {
		if _, err := e.client.VerifyDomain(ctx, &shortenerv1.VerifyDomainRequest{Name: "dns.acme.example"}); err != nil {
			t.Fatal(err)
		}
	}
	want("verifying twice", "approved.acme.example", "approved.acme.example", "dns.acme.example")
}

// slowTXT answers no lookup before its context ends, as a DNS server that
// does not answer.
type slowTXT struct{}

func (slowTXT) LookupTXT(ctx context.Context, name string) ([]string, error) {
	<-ctx.Done()
	return nil, &net.DNSError{Err: ctx.Err().Error(), Name: name, IsTimeout: true}
}

// A lookup is bounded by the caller's deadline too, with time left to
// answer: a DNS server slower than the gateway's call timeout is
// DNS_UNAVAILABLE, not the caller's DEADLINE_EXCEEDED.
func TestVerifyDomainLookupEndsBeforeTheCallersDeadline(t *testing.T) {
	e := newEnvWith(t, func(d *linkapi.Deps) {
		d.Domains = &fakeDomains{m: map[string]map[string]linkstore.Domain{}}
		d.TXT = slowTXT{}
	}, func(o *linkapi.Options) { o.MaxDomains, o.DNSTimeout = 3, time.Minute })
	ctx := as("acme")
	if _, err := e.client.RegisterDomain(ctx, &shortenerv1.RegisterDomainRequest{Name: "go.acme.example"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := e.client.VerifyDomain(ctx, &shortenerv1.VerifyDomainRequest{Name: "go.acme.example"})
	wantStatus(t, "a lookup slower than the call's deadline", err, codes.Unavailable, linkapi.ReasonDNSUnavailable, "")
}
