package linkapi_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/services/shortener/internal/codegen"
	"kurz.dev/services/shortener/internal/linkapi"
	"kurz.dev/services/shortener/internal/linkstore"
)

const fromURL = shortenerv1.CodeMode_CODE_MODE_FROM_URL

// unitCodeKey is the code key newEnv's service runs with.
var unitCodeKey = []byte("linkapi-unit-test-code-key-0123456789")

func createFromURL(t *testing.T, e *env, tenant, long string) *shortenerv1.CreateLinkResponse {
	t.Helper()
	resp, err := e.client.CreateLink(as(tenant), &shortenerv1.CreateLinkRequest{LongUrl: long, Mode: fromURL, Tags: []string{"first"}})
	if err != nil {
		t.Fatalf("create %s from the URL as %s: %v", long, tenant, err)
	}
	return resp
}

// Shortening one URL again returns the tenant's link of it, unchanged and
// without asking the limiter; the URL is compared once normalised; another
// tenant's link of the URL is another link.
func TestFromURLReturnsTheTenantsLinkOfTheURL(t *testing.T) {
	e := newEnv(t)
	first := createFromURL(t, e, "acme", "https://example.com/spring")
	f, _ := codegen.NewFromURL(unitCodeKey)
	if !first.GetCreated() || first.GetLink().GetCode() != f.Candidate("acme", "https://example.com/spring", 0) {
		t.Fatalf("first create: created %v, code %s; want a new link with the URL's first candidate", first.GetCreated(), first.GetLink().GetCode())
	}
	quotaCalls := len(e.limiter.Calls())
	e.limiter.SetDecider(limitertest.Deny("per-tenant", time.Second)) // a repeat needs no quota
	again, err := e.client.CreateLink(as("acme"), &shortenerv1.CreateLinkRequest{LongUrl: "HTTPS://Example.COM/spring", Mode: fromURL, Tags: []string{"second"}})
	if err != nil {
		t.Fatalf("the same URL again, written otherwise: %v", err)
	}
	if again.GetCreated() || again.GetLink().GetCode() != first.GetLink().GetCode() || again.GetLink().GetTags()[0] != "first" {
		t.Errorf("again: created %v, %v; want the first link, unchanged", again.GetCreated(), again.GetLink())
	}
	if n := len(e.limiter.Calls()); n != quotaCalls {
		t.Errorf("the repeat asked the limiter %d times, want none", n-quotaCalls)
	}
	e.limiter.SetDecider(limitertest.AllowAll)
	other := createFromURL(t, e, "globex", "https://example.com/spring")
	if !other.GetCreated() || other.GetLink().GetCode() == first.GetLink().GetCode() {
		t.Errorf("another tenant's link of the URL: created %v, code %s (acme's %s)", other.GetCreated(), other.GetLink().GetCode(), first.GetLink().GetCode())
	}
	plain, err := e.client.CreateLink(as("acme"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/spring"})
	if err != nil || !plain.GetCreated() || plain.GetLink().GetCode() == first.GetLink().GetCode() {
		t.Errorf("a sequential link of the same URL: %v, %v; want a new link of its own", plain, err)
	}
}

// A candidate held by another link yields to the next one, a deleted link's
// code is never reused, a new long URL frees the link's URL, and a URL
// whose every candidate is taken is refused.
func TestFromURLCandidates(t *testing.T) {
	e := newEnv(t)
	f, _ := codegen.NewFromURL(unitCodeKey)
	const long = "https://example.com/taken"
	taken := f.Candidate("acme", long, 0)
	if _, err := e.store.Insert(t.Context(), linkstore.Link{Code: taken, Tenant: "globex", LongURL: "https://example.com/other"}); err != nil {
		t.Fatal(err)
	}
	l := createFromURL(t, e, "acme", long)
	if l.GetLink().GetCode() != f.Candidate("acme", long, 1) {
		t.Errorf("first candidate taken: code %s, want the second candidate %s", l.GetLink().GetCode(), f.Candidate("acme", long, 1))
	}

	if _, err := e.client.DeleteLink(as("acme"), &shortenerv1.DeleteLinkRequest{Code: l.GetLink().GetCode()}); err != nil {
		t.Fatal(err)
	}
	renewed := createFromURL(t, e, "acme", long)
	if !renewed.GetCreated() || renewed.GetLink().GetCode() != f.Candidate("acme", long, 2) {
		t.Errorf("after delete: created %v, code %s; want a new link with the third candidate", renewed.GetCreated(), renewed.GetLink().GetCode())
	}

	moved := &shortenerv1.Link{Code: renewed.GetLink().GetCode(), LongUrl: "https://example.com/moved"}
	if _, err := e.client.UpdateLink(as("acme"), &shortenerv1.UpdateLinkRequest{Link: moved, UpdateMask: mask("long_url")}); err != nil {
		t.Fatal(err)
	}
	if next := createFromURL(t, e, "acme", long); !next.GetCreated() || next.GetLink().GetCode() != f.Candidate("acme", long, 3) {
		t.Errorf("after the link moved to another URL: created %v, code %s; want a new link", next.GetCreated(), next.GetLink().GetCode())
	}

	const full = "https://example.com/full"
	for i := range 20 {
		if _, err := e.store.Insert(t.Context(), linkstore.Link{Code: f.Candidate("acme", full, i), Tenant: "globex", LongURL: "https://example.com/x"}); err != nil {
			t.Fatal(err)
		}
	}
	if l := createFromURL(t, e, "acme", full); l.GetLink().GetCode() != f.Candidate("acme", full, 20) {
		t.Errorf("the first 20 candidates taken: code %s, want the 21st candidate %s", l.GetLink().GetCode(), f.Candidate("acme", full, 20))
	}

	held := newEnvWith(t, func(d *linkapi.Deps) { d.Store = everyCodeTaken{d.Store} })
	_, err := held.client.CreateLink(as("acme"), &shortenerv1.CreateLinkRequest{LongUrl: full, Mode: fromURL})
	wantStatus(t, "every candidate taken", err, codes.FailedPrecondition, linkapi.ReasonFromURLExhausted, "mode")
	if _, err := e.client.CreateLink(as("acme"), &shortenerv1.CreateLinkRequest{LongUrl: full, Mode: fromURL, CustomAlias: "mine"}); grpcstatus.Code(err) != codes.InvalidArgument {
		t.Errorf("from the URL with an alias: %v, want InvalidArgument", err)
	}
}

// everyCodeTaken is a store where every code is held by a link.
type everyCodeTaken struct{ linkapi.Store }

func (s everyCodeTaken) Insert(ctx context.Context, l linkstore.Link) (linkstore.Link, error) {
	return linkstore.Link{}, linkstore.ErrCodeTaken
}

func (s everyCodeTaken) Taken(ctx context.Context, codes []string) (map[string]bool, error) {
	held := make(map[string]bool, len(codes))
	for _, c := range codes {
		held[c] = true
	}
	return held, nil
}

// Anonymous callers all share tenant "anonymous": codes from the URL would
// hand one of them another's link of the URL (tags, targets, limits) and
// tell anybody whether a URL was shortened. The mode is refused to them and
// nothing is stored from the URL; other modes work for them, and a tenant
// with a key keeps the mode. (Batches: TestBatchFromURLRefusedToAnonymousCallers,
// integration tier, where the cache takes pipelines.)
func TestFromURLRefusedToAnonymousCallers(t *testing.T) {
	e := newEnv(t, func(o *linkapi.Options) { o.AllowAnonymous = true })
	const long = "https://example.com/private-report"
	_, err := e.client.CreateLink(as(""), &shortenerv1.CreateLinkRequest{LongUrl: long, Mode: fromURL, Tags: []string{"private"}})
	wantStatus(t, "anonymous create from the URL", err, codes.PermissionDenied, linkapi.ReasonFromURLTenantRequired, "mode")
	if l, err := e.store.FromURL(t.Context(), "anonymous", codegen.URLKey("", long)); err == nil {
		t.Errorf("the anonymous tenant has a link from the URL: %s", l.Code)
	}
	if _, err := e.client.CreateLink(as(""), &shortenerv1.CreateLinkRequest{LongUrl: long}); err != nil {
		t.Errorf("anonymous sequential create: %v", err)
	}
	if keyed := createFromURL(t, e, "acme", long); !keyed.GetCreated() {
		t.Errorf("a tenant with a key: %v; want its link created from the URL", keyed)
	}
}

// A link of the URL that no longer works (disabled by its tenant, or
// expired) is not "the tenant's link of the URL": creating from the URL
// again makes a new, working link under the next candidate code, and the
// old one stays as it was, without the URL. Repeats return the new link.
func TestFromURLReplacesADeadLink(t *testing.T) {
	past := time.Now().Add(-time.Minute)
	expired := &past
	disabled := true
	for name, kill := range map[string]linkstore.Changes{"disabled": {Disabled: &disabled}, "expired": {Expires: &expired}} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			f, _ := codegen.NewFromURL(unitCodeKey)
			const long = "https://example.com/dead"
			old := createFromURL(t, e, "acme", long)
			if _, err := e.store.Update(t.Context(), "acme", old.GetLink().GetCode(), kill); err != nil {
				t.Fatal(err)
			}

			fresh := createFromURL(t, e, "acme", long)
			if !fresh.GetCreated() || fresh.GetLink().GetCode() != f.Candidate("acme", long, 1) {
				t.Fatalf("again after the link was %s: created %v, code %s; want a new link with the second candidate %s",
					name, fresh.GetCreated(), fresh.GetLink().GetCode(), f.Candidate("acme", long, 1))
			}
			if fresh.GetLink().GetDisabled() || fresh.GetLink().GetExpireTime() != nil {
				t.Errorf("the new link: %v; want it working", fresh.GetLink())
			}
			if entry, _ := e.cache.entry(t, fresh.GetLink().GetCode()); entry.State != linkcache.Active {
				t.Errorf("the new link's cache entry %+v, want active", entry)
			}
			if again := createFromURL(t, e, "acme", long); again.GetCreated() || again.GetLink().GetCode() != fresh.GetLink().GetCode() {
				t.Errorf("a repeat: created %v, code %s; want the new link %s", again.GetCreated(), again.GetLink().GetCode(), fresh.GetLink().GetCode())
			}
			l, err := e.store.Get(t.Context(), "acme", old.GetLink().GetCode())
			if err != nil || l.URLKey != nil || l.Disabled != (name == "disabled") {
				t.Errorf("the old link: %+v, %v; want it kept as it was, without the URL", l, err)
			}
		})
	}
}

// A visit-limited link made from the URL whose visits are all spent
// answers 410: like a disabled or expired one, it gives the URL up to a
// new link. Until then, and while its counter cannot be read, it is the
// link of the URL.
func TestFromURLReplacesALinkWhoseVisitsAreSpent(t *testing.T) {
	e := newEnv(t)
	f, _ := codegen.NewFromURL(unitCodeKey)
	const long = "https://example.com/limited"
	create := func() *shortenerv1.CreateLinkResponse {
		t.Helper()
		resp, err := e.client.CreateLink(as("acme"), &shortenerv1.CreateLinkRequest{LongUrl: long, Mode: fromURL, MaxVisits: 2})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	old := create().GetLink().GetCode()
	e.cache.setVisits(old, 1)
	if again := create(); again.GetCreated() || again.GetLink().GetCode() != old {
		t.Fatalf("one visit of 2 spent: created %v, code %s; want the link %s", again.GetCreated(), again.GetLink().GetCode(), old)
	}
	e.cache.setVisits(old, 2)
	e.cache.getErr = errors.New("dial tcp: connection refused")
	if again := create(); again.GetCreated() || again.GetLink().GetCode() != old {
		t.Fatalf("counter unreadable: created %v, code %s; want the link %s as it is", again.GetCreated(), again.GetLink().GetCode(), old)
	}
	e.cache.getErr = nil
	fresh := create()
	if !fresh.GetCreated() || fresh.GetLink().GetCode() != f.Candidate("acme", long, 1) {
		t.Fatalf("visits spent: created %v, code %s; want a new link with the second candidate %s",
			fresh.GetCreated(), fresh.GetLink().GetCode(), f.Candidate("acme", long, 1))
	}
	if again := create(); again.GetCreated() || again.GetLink().GetCode() != fresh.GetLink().GetCode() {
		t.Errorf("a repeat: created %v, code %s; want the new link %s", again.GetCreated(), again.GetLink().GetCode(), fresh.GetLink().GetCode())
	}
	if l, err := e.store.Get(t.Context(), "acme", old); err != nil || l.URLKey != nil || l.MaxVisits != 2 {
		t.Errorf("the spent link: %+v, %v; want it kept as it was, without the URL", l, err)
	}

}

// Each disable of the URL's link lets the next create make a new link, for
// as long as the tenant goes on: the tenant's own earlier links of the URL
// (which keep their codes for good) do not use up the codes the URL can
// have, and each new link takes the next candidate.
func TestFromURLOutlivesManyDisabledLinksOfTheURL(t *testing.T) {
	e := newEnv(t)
	f, _ := codegen.NewFromURL(unitCodeKey)
	const long = "https://example.com/again-and-again"
	for i := range 40 {
		l := createFromURL(t, e, "acme", long)
		if !l.GetCreated() || l.GetLink().GetCode() != f.Candidate("acme", long, i) {
			t.Fatalf("create %d: created %v, code %s; want a new link with candidate %d, %s",
				i+1, l.GetCreated(), l.GetLink().GetCode(), i, f.Candidate("acme", long, i))
		}
		if _, err := e.client.UpdateLink(as("acme"), &shortenerv1.UpdateLinkRequest{
			Link: &shortenerv1.Link{Code: l.GetLink().GetCode(), Disabled: true}, UpdateMask: mask("disabled")}); err != nil {
			t.Fatal(err)
		}
	}
}
