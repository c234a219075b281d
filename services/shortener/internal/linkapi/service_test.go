package linkapi_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/capacity"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkimport"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/services/shortener/internal/linkapi"
	"kurz.dev/services/shortener/internal/linkstore"
	"kurz.dev/services/shortener/internal/linkstore/linkstoretest"
	"kurz.dev/services/shortener/internal/urlcheck"
)

func mask(paths ...string) *fieldmaskpb.FieldMask { return &fieldmaskpb.FieldMask{Paths: paths} }

// A link goes through its whole life: created (in each code mode), read,
// listed, updated and deleted, with each change written through to the
// cache the redirect reads.
func TestLinkLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := as("acme")

	for name, req := range map[string]*shortenerv1.CreateLinkRequest{
		"sequential": {LongUrl: "https://Example.com/seq"},
		"random":     {LongUrl: "https://example.com/rnd", Mode: shortenerv1.CodeMode_CODE_MODE_RANDOM},
		"custom":     {LongUrl: "https://example.com/own", CustomAlias: "acme-own"},
	} {
		resp, err := e.client.CreateLink(ctx, req)
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		l := resp.GetLink()
		if l.GetCode() == "" || l.GetShortUrl() != baseURL+"/"+l.GetCode() || l.GetTenant() != "acme" ||
			!strings.EqualFold(l.GetLongUrl(), req.GetLongUrl()) {
			t.Errorf("create %s: got %v", name, l)
		}
		if name == "custom" && l.GetCode() != "acme-own" {
			t.Errorf("create custom: code %q, want the alias acme-own", l.GetCode())
		}
		if got, found := e.cache.entry(t, l.GetCode()); !found || got.State != linkcache.Active || got.URL != l.GetLongUrl() || got.Tenant != "acme" {
			t.Errorf("create %s: cache entry %+v (found %v), want it active on %s", name, got, found, l.GetLongUrl())
		}
	}

	created, err := e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/life",
		Tags: []string{"Blue", "blue", "red"}, RedirectType: shortenerv1.RedirectType_REDIRECT_TYPE_MOVED_PERMANENTLY})
	if err != nil {
		t.Fatal(err)
	}
	code := created.GetLink().GetCode()
	if got, want := created.GetLink().GetTags(), []string{"blue", "red"}; !slices.Equal(got, want) {
		t.Errorf("tags %v, want %v (lowered, de-duplicated)", got, want)
	}

	got, err := e.client.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetLink().GetLongUrl() != "https://example.com/life" || got.GetLink().GetRedirectType() != shortenerv1.RedirectType_REDIRECT_TYPE_MOVED_PERMANENTLY {
		t.Errorf("get: %v", got.GetLink())
	}

	list, err := e.client.ListLinks(ctx, &shortenerv1.ListLinksRequest{Tag: "RED"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetLinks()) != 1 || list.GetLinks()[0].GetCode() != code {
		t.Errorf("list tagged red: %v, want only %s", list.GetLinks(), code)
	}
	list, err = e.client.ListLinks(ctx, &shortenerv1.ListLinksRequest{PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetLinks()) != 2 || list.GetLinks()[0].GetCode() != code || list.GetNextPageToken() == "" {
		t.Fatalf("first page of 2: %v next %q, want the newest link first and a next page", list.GetLinks(), list.GetNextPageToken())
	}
	rest, err := e.client.ListLinks(ctx, &shortenerv1.ListLinksRequest{PageSize: 10, PageToken: list.GetNextPageToken()})
	if err != nil {
		t.Fatal(err)
	}
	if len(rest.GetLinks()) != 2 || rest.GetNextPageToken() != "" {
		t.Errorf("second page: %v next %q, want the 2 other links and no next page", rest.GetLinks(), rest.GetNextPageToken())
	}

	updated, err := e.client.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
		Link:       &shortenerv1.Link{Code: code, LongUrl: "https://example.com/moved", Disabled: true, Tags: []string{"green"}},
		UpdateMask: mask("long_url", "tags"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if u := updated.GetLink(); u.GetLongUrl() != "https://example.com/moved" || !slices.Equal(u.GetTags(), []string{"green"}) || u.GetDisabled() {
		t.Errorf("update of long_url and tags: %v, want both changed and disabled (not in the mask) kept", u)
	}
	if entry, _ := e.cache.entry(t, code); entry.URL != "https://example.com/moved" {
		t.Errorf("cache entry after update: %+v, want the new URL", entry)
	}

	if _, err := e.client.DeleteLink(ctx, &shortenerv1.DeleteLinkRequest{Code: code}); err != nil {
		t.Fatal(err)
	}
	_, err = e.client.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code})
	wantStatus(t, "get after delete", err, codes.NotFound, "", "")
	if entry, _ := e.cache.entry(t, code); entry.State != linkcache.Gone {
		t.Errorf("cache entry after delete: %+v, want gone", entry)
	}
	if !slices.Contains(e.cache.published, code) {
		t.Errorf("published %v, want the deleted code among them", e.cache.published)
	}
}

// deletedAtOnce is a link store whose every new link is deleted by another
// call the moment its insert commits, before the create writes it through.
// deletedAtOnce deletes every link it inserts through del (the service's
// DeleteLink, with its own write-through) before the insert returns: a
// change committed between a create's insert and the create's write-through.
type deletedAtOnce struct {
	*linkstoretest.Fake
	del func(linkstore.Link)
}

func (s deletedAtOnce) Insert(ctx context.Context, l linkstore.Link) (linkstore.Link, error) {
	stored, err := s.Fake.Insert(ctx, l)
	if err == nil {
		s.del(stored)
	}
	return stored, err
}

// A create's write-through never undoes a change committed since its insert
// whose own write-through came first: the redirect would serve the deleted
// link for the cache TTL. (A change whose write-through comes later
// overwrites the create's, as it overwrites anything.)
func TestCreateDoesNotUndoAChangeCommittedSinceItsInsert(t *testing.T) {
	var e *env
	store := deletedAtOnce{del: func(l linkstore.Link) {
		if _, err := e.client.DeleteLink(as(l.Tenant), &shortenerv1.DeleteLinkRequest{Code: l.Code}); err != nil {
			t.Errorf("delete %s between its insert and its write-through: %v", l.Code, err)
		}
	}}
	e = newEnvWith(t, func(d *linkapi.Deps) {
		store.Fake = d.Store.(*linkstoretest.Fake)
		d.Store = store
	})
	resp, err := e.client.CreateLink(as("acme"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/raced"})
	if err != nil {
		t.Fatal(err)
	}
	if got, found := e.cache.entry(t, resp.GetLink().GetCode()); !found || got.State != linkcache.Gone {
		t.Errorf("cache entry %+v (found %v) of a link deleted before its write-through, want gone", got, found)
	}
}

// A create's write-through replaces a negative entry: a read of the code
// before the insert (a scanner guessing it, a custom alias tried first).
func TestCreateReplacesANegativeEntry(t *testing.T) {
	e := newEnv(t)
	e.cache.Set(context.Background(), linkcache.Key("guessed"), linkcache.Marshal(linkcache.Entry{State: linkcache.Missing}), time.Minute)
	if _, err := e.client.CreateLink(as("acme"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/g", CustomAlias: "guessed"}); err != nil {
		t.Fatal(err)
	}
	if got, found := e.cache.entry(t, "guessed"); !found || got.State != linkcache.Active || got.URL != "https://example.com/g" {
		t.Errorf("cache entry %+v (found %v) after creating a code Redis held as missing, want it active", got, found)
	}
}

// Every refused argument is INVALID_ARGUMENT with the reason and field in an
// ErrorInfo, and nothing is stored or charged.
func TestCreateRefusesBadArguments(t *testing.T) {
	e := newEnv(t)
	past := timestamppb.New(time.Now().Add(-time.Hour))
	for name, tc := range map[string]struct {
		req           *shortenerv1.CreateLinkRequest
		reason, field string
	}{
		"no url":             {&shortenerv1.CreateLinkRequest{}, urlcheck.ReasonRequired, "long_url"},
		"script scheme":      {&shortenerv1.CreateLinkRequest{LongUrl: "javascript:alert(1)"}, urlcheck.ReasonScheme, "long_url"},
		"private host":       {&shortenerv1.CreateLinkRequest{LongUrl: "http://127.0.0.1/admin"}, urlcheck.ReasonPrivateHost, "long_url"},
		"bad alias":          {&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com", CustomAlias: "a b"}, linkapi.ReasonAliasInvalid, "custom_alias"},
		"reserved alias":     {&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com", CustomAlias: "healthz"}, linkapi.ReasonAliasReserved, "custom_alias"},
		"alias with random":  {&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com", CustomAlias: "mine", Mode: shortenerv1.CodeMode_CODE_MODE_RANDOM}, linkapi.ReasonModeInvalid, "custom_alias"},
		"custom, no alias":   {&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com", Mode: shortenerv1.CodeMode_CODE_MODE_CUSTOM}, linkapi.ReasonAliasInvalid, "custom_alias"},
		"unknown mode":       {&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com", Mode: 99}, linkapi.ReasonModeInvalid, "mode"},
		"unknown redirect":   {&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com", RedirectType: 99}, linkapi.ReasonRedirectInvalid, "redirect_type"},
		"expiry in the past": {&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com", ExpireTime: past}, linkapi.ReasonExpireTimeInvalid, "expire_time"},
		"bad tag":            {&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com", Tags: []string{"no spaces"}}, linkapi.ReasonTagsInvalid, "tags"},
		"negative visits":    {&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com", MaxVisits: -1}, linkapi.ReasonMaxVisitsInvalid, "max_visits"},
		"short password":     {&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com", Password: "short"}, linkapi.ReasonPasswordInvalid, "password"},
		"NUL password":       {&shortenerv1.CreateLinkRequest{LongUrl: "https://example.com", Password: strings.Repeat("\x00", 8)}, linkapi.ReasonPasswordInvalid, "password"},
	} {
		_, err := e.client.CreateLink(as("acme"), tc.req)
		wantStatus(t, name, err, codes.InvalidArgument, tc.reason, tc.field)
	}
	list, err := e.client.ListLinks(as("acme"), &shortenerv1.ListLinksRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetLinks()) != 0 || len(e.limiter.Calls()) != 0 {
		t.Errorf("after refused creates: %d links stored, %d quota checks; want none", len(list.GetLinks()), len(e.limiter.Calls()))
	}
}

func TestUpdateAndListRefuseBadArguments(t *testing.T) {
	e := newEnv(t)
	ctx := as("acme")
	l, err := e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/kept", Tags: []string{"red"}})
	if err != nil {
		t.Fatal(err)
	}
	code := l.GetLink().GetCode()
	for name, tc := range map[string]struct {
		req           *shortenerv1.UpdateLinkRequest
		reason, field string
	}{
		"no link":      {&shortenerv1.UpdateLinkRequest{UpdateMask: mask("long_url")}, linkapi.ReasonLinkRequired, "link"},
		"no mask":      {&shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code}}, linkapi.ReasonUpdateMaskInvalid, "update_mask"},
		"unknown path": {&shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code}, UpdateMask: mask("tenant")}, linkapi.ReasonUpdateMaskInvalid, "update_mask"},
		"bad url":      {&shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code, LongUrl: "ftp://x"}, UpdateMask: mask("long_url")}, urlcheck.ReasonScheme, "long_url"},
		"bad tags":     {&shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code, Tags: []string{""}}, UpdateMask: mask("tags")}, linkapi.ReasonTagsInvalid, "tags"},
	} {
		_, err := e.client.UpdateLink(ctx, tc.req)
		wantStatus(t, "update, "+name, err, codes.InvalidArgument, tc.reason, tc.field)
	}
	if got, err := e.client.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code}); err != nil || got.GetLink().GetLongUrl() != "https://example.com/kept" {
		t.Errorf("after refused updates: %v, %v; want the link unchanged", got.GetLink(), err)
	}

	if _, err := e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/2", Tags: []string{"red"}}); err != nil {
		t.Fatal(err)
	}
	first, err := e.client.ListLinks(ctx, &shortenerv1.ListLinksRequest{PageSize: 1, Tag: "red"})
	if err != nil || first.GetNextPageToken() == "" {
		t.Fatalf("first page of 1 tagged red: %v, %v; want a next page", first, err)
	}
	for name, tc := range map[string]struct {
		req    *shortenerv1.ListLinksRequest
		reason string
		field  string
	}{
		"negative size":     {&shortenerv1.ListLinksRequest{PageSize: -1}, linkapi.ReasonPageSizeInvalid, "page_size"},
		"made-up token":     {&shortenerv1.ListLinksRequest{PageToken: "nope"}, linkapi.ReasonPageTokenInvalid, "page_token"},
		"another tag's":     {&shortenerv1.ListLinksRequest{PageToken: first.GetNextPageToken(), Tag: "blue"}, linkapi.ReasonPageTokenInvalid, "page_token"},
		"bad tag":           {&shortenerv1.ListLinksRequest{Tag: "a/b"}, linkapi.ReasonTagsInvalid, "tag"},
		"token without tag": {&shortenerv1.ListLinksRequest{PageToken: first.GetNextPageToken()}, linkapi.ReasonPageTokenInvalid, "page_token"},
	} {
		_, err := e.client.ListLinks(ctx, tc.req)
		wantStatus(t, "list, "+name, err, codes.InvalidArgument, tc.reason, tc.field)
	}
	// Another tenant's token is refused, not read as a position in the
	// sender's own links.
	_, err = e.client.ListLinks(as("globex"), &shortenerv1.ListLinksRequest{PageToken: first.GetNextPageToken(), Tag: "red"})
	wantStatus(t, "list, another tenant's token", err, codes.InvalidArgument, linkapi.ReasonPageTokenInvalid, "page_token")
}

// A denied quota check is RESOURCE_EXHAUSTED with the rule and a retry
// delay, and nothing is created; the check is keyed by tenant and client.
func TestQuotaDenialCreatesNothing(t *testing.T) {
	e := newEnv(t)
	e.limiter.SetDecider(limitertest.Deny("per-tenant", 3*time.Second))
	_, err := e.client.CreateLink(as("acme"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/denied", CustomAlias: "denied"})
	wantStatus(t, "create over quota", err, codes.ResourceExhausted, rpcerr.ReasonRateLimited, "")
	var retry *errdetails.RetryInfo
	for _, d := range status.Convert(err).Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			retry = r
		}
	}
	if retry.GetRetryDelay().AsDuration() != 3*time.Second || !strings.Contains(status.Convert(err).Message(), "per-tenant") {
		t.Errorf("denial %v with retry info %v; want the rule named and a retry delay of 3s", err, retry)
	}
	calls := e.limiter.Calls()
	if len(calls) != 1 || calls[0].GetDomain() != linkapi.QuotaDomain || calls[0].GetDescriptors()["tenant"] != "acme" ||
		calls[0].GetDescriptors()["ip"] == "" {
		t.Errorf("quota checks %v, want one on %s keyed by tenant acme and the client IP", calls, linkapi.QuotaDomain)
	}

	e.limiter.SetDecider(limitertest.AllowAll)
	if _, err := e.client.GetLink(as("acme"), &shortenerv1.GetLinkRequest{Code: "denied"}); status.Code(err) != codes.NotFound {
		t.Errorf("the denied alias: %v, want NotFound (nothing stored)", err)
	}
	if _, found := e.cache.entry(t, "denied"); found {
		t.Error("the denied link reached the cache")
	}
}

// A batch costing more than the quota's rule ever holds (its capacity, the
// bucket's burst) is INVALID_ARGUMENT naming the largest batch that can
// pass, not a RESOURCE_EXHAUSTED its caller would retry forever; a batch
// within the capacity that is denied stays RESOURCE_EXHAUSTED.
func TestBatchBeyondTheQuotaCapacityIsInvalid(t *testing.T) {
	e := newEnv(t)
	e.limiter.SetDecider(func(req *ratelimitv1.CheckQuotaRequest) *ratelimitv1.CheckQuotaResponse {
		d := &ratelimitv1.RuleDecision{Rule: "per-tenant", Limit: 30, Capacity: 10, Remaining: 4,
			RetryAfter: durationpb.New(time.Minute), Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS}
		return &ratelimitv1.CheckQuotaResponse{Allowed: false, DecidingRule: "per-tenant", Limit: 30, Remaining: 4,
			RetryAfter: d.RetryAfter, Source: d.Source, Decisions: []*ratelimitv1.RuleDecision{d}}
	})
	batch := func(n int) error {
		req := &shortenerv1.BatchCreateLinksRequest{}
		for i := range n {
			req.Requests = append(req.Requests, &shortenerv1.CreateLinkRequest{LongUrl: fmt.Sprintf("https://example.com/cap/%d", i)})
		}
		_, err := e.client.BatchCreateLinks(as("acme"), req)
		return err
	}
	err := batch(11)
	wantStatus(t, "a batch of 11 against a capacity of 10", err, codes.InvalidArgument, linkapi.ReasonBatchSizeInvalid, "requests")
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "at most 10") {
		t.Errorf("message %q does not name the largest batch", msg)
	}
	if info, _, _ := rpcerr.Details(err); info.GetMetadata()[linkapi.MetaMaxBatch] != "10" {
		t.Errorf("ErrorInfo metadata %v, want %s 10 (what an import re-chunks by)", info.GetMetadata(), linkapi.MetaMaxBatch)
	}
	wantStatus(t, "a batch of 10 denied", batch(10), codes.ResourceExhausted, rpcerr.ReasonRateLimited, "")
}

// A batch is not charged for the aliases some link holds already: the
// caller's own (to another URL) and another tenant's fail ALREADY_EXISTS
// before the quota check, so that an import whose codes are taken is
// never stuck spending its quota on them.
func TestBatchIsNotChargedForTakenAliases(t *testing.T) {
	e := newEnv(t)
	batch := func(path string, aliases ...string) *shortenerv1.BatchCreateLinksResponse {
		t.Helper()
		req := &shortenerv1.BatchCreateLinksRequest{}
		for _, a := range aliases {
			req.Requests = append(req.Requests, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/" + path + a, CustomAlias: a})
		}
		resp, err := e.client.BatchCreateLinks(as("acme"), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if got := batch("", "again-1").GetCreated() + batch("", "again-2").GetCreated(); got != 2 {
		t.Fatalf("the first batches created %d, want 2", got)
	}
	if _, err := e.client.CreateLink(as("globex"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/other/again-g", CustomAlias: "again-g"}); err != nil {
		t.Fatal(err)
	}
	before := len(e.limiter.Calls())
	resp := batch("other/", "again-1", "again-g", "again-3", "again-2")
	for i, r := range resp.GetResults() {
		wantTaken := i != 2
		if gotTaken := r.GetError().GetCode() == "ALREADY_EXISTS"; gotTaken != wantTaken || r.GetCreated() == wantTaken {
			t.Errorf("item %d: created %v, error %v; want taken %v", i, r.GetCreated(), r.GetError(), wantTaken)
		}
	}
	calls := e.limiter.Calls()[before:]
	if len(calls) != 1 || calls[0].GetCost() != 1 {
		t.Errorf("quota checks of the batch: %v; want one, of cost 1 (the new alias)", calls)
	}
	before = len(e.limiter.Calls())
	if resp := batch("other/", "again-1", "again-2"); resp.GetCreated() != 0 || len(e.limiter.Calls()) != before {
		t.Errorf("a batch of taken aliases only: created %d, %d quota checks; want none of either", resp.GetCreated(), len(e.limiter.Calls())-before)
	}
}

// A batch sent again (its answer lost, or an import run again) answers
// each item whose alias is already the caller's link to the same URL with
// that link, not created and not charged, as a create sent again is
// answered: docs/api.md tells clients a batch with aliases is safe to send
// again. The same alias to another URL, or another tenant's, stays
// ALREADY_EXISTS.
func TestBatchSentAgainAnswersItsAliasesLinks(t *testing.T) {
	e := newEnv(t)
	items := []*shortenerv1.CreateLinkRequest{
		{LongUrl: "https://example.com/resend/0", CustomAlias: "Resend-0"},
		{LongUrl: "https://EXAMPLE.com:443/resend/1", CustomAlias: "resend-1", Tags: []string{"t"}},
	}
	first, err := e.client.BatchCreateLinks(as("acme"), &shortenerv1.BatchCreateLinksRequest{Requests: items})
	if err != nil || first.GetCreated() != 2 {
		t.Fatalf("first batch: %v, %v; want 2 created", first, err)
	}
	before := len(e.limiter.Calls())
	again, err := e.client.BatchCreateLinks(as("acme"), &shortenerv1.BatchCreateLinksRequest{Requests: items})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range again.GetResults() {
		want := first.GetResults()[i].GetLink()
		if r.GetError() != nil || r.GetCreated() || r.GetLink().GetCode() != want.GetCode() || r.GetLink().GetLongUrl() != want.GetLongUrl() {
			t.Errorf("item %d sent again: created %v, link %v, error %v; want the link %s, not created", i, r.GetCreated(), r.GetLink(), r.GetError(), want.GetCode())
		}
	}
	if again.GetCreated() != 0 || len(e.limiter.Calls()) != before {
		t.Errorf("the batch sent again: created %d, %d quota checks; want none of either", again.GetCreated(), len(e.limiter.Calls())-before)
	}

	other := []*shortenerv1.CreateLinkRequest{{LongUrl: "https://example.com/resend/elsewhere", CustomAlias: "Resend-0"}}
	resp, err := e.client.BatchCreateLinks(as("acme"), &shortenerv1.BatchCreateLinksRequest{Requests: other})
	if err != nil || resp.GetResults()[0].GetError().GetCode() != "ALREADY_EXISTS" {
		t.Errorf("the caller's alias to another URL: %v, %v; want ALREADY_EXISTS", resp, err)
	}
	resp, err = e.client.BatchCreateLinks(as("globex"), &shortenerv1.BatchCreateLinksRequest{Requests: items[:1]})
	if err != nil || resp.GetResults()[0].GetError().GetCode() != "ALREADY_EXISTS" || resp.GetResults()[0].GetLink() != nil {
		t.Errorf("another tenant's alias to the same URL: %v, %v; want ALREADY_EXISTS and no link", resp, err)
	}
}

// A batch item whose alias is the caller's link to the same URL that no
// longer redirects (disabled, expired, its visits spent) fails
// FAILED_PRECONDITION on custom_alias, naming why, rather than answering
// that link as the item's: an import sent again was told such a row was
// there while its short URL answered 410. Nothing is created or charged.
func TestBatchRefusesAnAliasWhoseLinkNoLongerRedirects(t *testing.T) {
	past := time.Now().Add(-time.Minute)
	expired, disabled := &past, true
	for why, kill := range map[string]func(e *env, code string){
		"disabled": func(e *env, code string) {
			if _, err := e.store.Update(t.Context(), "acme", code, linkstore.Changes{Disabled: &disabled}); err != nil {
				t.Fatal(err)
			}
		},
		"expired": func(e *env, code string) {
			if _, err := e.store.Update(t.Context(), "acme", code, linkstore.Changes{Expires: &expired}); err != nil {
				t.Fatal(err)
			}
		},
		"spent": func(e *env, code string) { e.cache.setVisits(code, 3) },
	} {
		t.Run(why, func(t *testing.T) {
			e := newEnv(t)
			items := []*shortenerv1.CreateLinkRequest{{LongUrl: "https://example.com/dead-alias", CustomAlias: "dead-alias", MaxVisits: 3}}
			if first, err := e.client.BatchCreateLinks(as("acme"), &shortenerv1.BatchCreateLinksRequest{Requests: items}); err != nil || first.GetCreated() != 1 {
				t.Fatalf("first batch: %v, %v; want 1 created", first, err)
			}
			kill(e, "dead-alias")
			before := len(e.limiter.Calls())
			again, err := e.client.BatchCreateLinks(as("acme"), &shortenerv1.BatchCreateLinksRequest{Requests: items})
			if err != nil {
				t.Fatal(err)
			}
			r := again.GetResults()[0]
			if ie := r.GetError(); ie.GetCode() != "FAILED_PRECONDITION" || ie.GetField() != "custom_alias" ||
				!strings.Contains(ie.GetMessage(), `"dead-alias" is taken by your link to this URL, which no longer redirects (`+why+`)`) || r.GetLink() != nil {
				t.Errorf("the item sent again after its link was %s: link %v, error %v; want FAILED_PRECONDITION on custom_alias naming why", why, r.GetLink(), ie)
			}
			if again.GetCreated() != 0 || len(e.limiter.Calls()) != before {
				t.Errorf("created %d, %d quota checks; want none of either", again.GetCreated(), len(e.limiter.Calls())-before)
			}
		})
	}
}

// A batch whose password items find every hashing slot taken (by other
// tenants' creates: the slots are the process's) fails them UNAVAILABLE
// PASSWORD_HASHING_BUSY without charging them, since the refusal asks for
// the same items again; its other items are created and charged. With a
// slot free, every password item it paid for is hashed, even when the
// slots it could hash in alongside are taken.
func TestBatchIsNotChargedForPasswordsRefusedForHashing(t *testing.T) {
	gate := capacity.New(2, 0)
	e := newEnvWith(t, func(d *linkapi.Deps) { d.Hashes = gate })
	batch := func(prefix string, passwords int) *shortenerv1.BatchCreateLinksRequest {
		req := &shortenerv1.BatchCreateLinksRequest{}
		for i := range passwords {
			req.Requests = append(req.Requests, &shortenerv1.CreateLinkRequest{
				LongUrl: fmt.Sprintf("https://example.com/%s/%d", prefix, i), Password: "correct horse"})
		}
		req.Requests = append(req.Requests, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/" + prefix + "/plain"})
		return req
	}
	var held []func()
	for range gate.Slots() {
		release, err := gate.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, release)
	}
	before := len(e.limiter.Calls())
	resp, err := e.client.BatchCreateLinks(as("acme"), batch("busy", 3))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.GetResults()[:3] {
		if r.GetError().GetCode() != "UNAVAILABLE" || !strings.Contains(r.GetError().GetMessage(), "hashed") {
			t.Errorf("item %d with a password while every slot is taken: %v, want UNAVAILABLE (hashing busy)", r.GetIndex(), r.GetError())
		}
	}
	if resp.GetCreated() != 1 || !resp.GetResults()[3].GetCreated() {
		t.Errorf("created %d (item 3: %v); want the item without a password", resp.GetCreated(), resp.GetResults()[3])
	}
	if calls := e.limiter.Calls()[before:]; len(calls) != 1 || calls[0].GetCost() != 1 {
		t.Errorf("quota checks of the batch: %v; want one, of cost 1 (the item created)", calls)
	}

	held[0]() // one slot free; the other stays taken
	defer held[1]()
	before = len(e.limiter.Calls())
	resp, err = e.client.BatchCreateLinks(as("acme"), batch("free", 5))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.GetResults() {
		if !r.GetCreated() || r.GetLink().GetPasswordProtected() != (r.GetIndex() < 5) {
			t.Errorf("item %d with one slot free: created %v, error %v, password %v", r.GetIndex(), r.GetCreated(), r.GetError(), r.GetLink().GetPasswordProtected())
		}
	}
	if calls := e.limiter.Calls()[before:]; len(calls) != 1 || calls[0].GetCost() != 6 {
		t.Errorf("quota checks of the batch: %v; want one, of cost 6", calls)
	}
}

// An import whose codes another tenant holds gets new codes for them
// within a quota of the file's size: the refused aliases are not charged
// before their rows are sent again. Charged, a free tenant (burst 10)
// importing 10 such rows was refused "nothing was created" on every run.
func TestImportOfAnotherTenantsCodesFitsTheQuota(t *testing.T) {
	e := newEnv(t)
	var rows []linkimport.Row
	for i := range 10 {
		code := fmt.Sprintf("lfq-%02d", i)
		if _, err := e.client.CreateLink(as("globex"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/g", CustomAlias: code}); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, linkimport.Row{Line: i + 2, SourceCode: code, LongURL: fmt.Sprintf("https://example.com/%d", i)})
	}
	// A bucket of 10 that does not refill during the test.
	var mu sync.Mutex
	left := uint32(10)
	e.limiter.SetDecider(func(req *ratelimitv1.CheckQuotaRequest) *ratelimitv1.CheckQuotaResponse {
		mu.Lock()
		defer mu.Unlock()
		allowed := req.GetCost() <= left
		if allowed {
			left -= req.GetCost()
		}
		d := &ratelimitv1.RuleDecision{Rule: "per-tenant", Limit: 10, Capacity: 10, Remaining: int64(left),
			RetryAfter: durationpb.New(time.Minute), Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS}
		return &ratelimitv1.CheckQuotaResponse{Allowed: allowed, DecidingRule: "per-tenant", Limit: 10, Remaining: int64(left),
			RetryAfter: d.RetryAfter, Source: d.Source, Decisions: []*ratelimitv1.RuleDecision{d}}
	})
	create := func(ctx context.Context, reqs []*shortenerv1.CreateLinkRequest) (*shortenerv1.BatchCreateLinksResponse, error) {
		return e.client.BatchCreateLinks(as("acme"), &shortenerv1.BatchCreateLinksRequest{Requests: reqs})
	}
	rep, err := linkimport.Import(context.Background(), rows, create, nil)
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if rep.Created != 10 || rep.AliasesKept != 0 || left != 0 {
		t.Errorf("created %d, %d aliases kept, %d of the quota left; want 10 new codes costing all 10", rep.Created, rep.AliasesKept, left)
	}
}

// A code that is not the caller's (unknown, never plausible, or deleted)
// is NOT_FOUND for every call.
func TestUnknownCodesAreNotFound(t *testing.T) {
	e := newEnv(t)
	ctx := as("acme")
	for _, code := range []string{"nosuchcode", "", "not a code!"} {
		_, err := e.client.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code})
		wantStatus(t, "get "+code, err, codes.NotFound, "", "")
		_, err = e.client.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: code, Disabled: true}, UpdateMask: mask("disabled")})
		wantStatus(t, "update "+code, err, codes.NotFound, "", "")
		_, err = e.client.DeleteLink(ctx, &shortenerv1.DeleteLinkRequest{Code: code})
		wantStatus(t, "delete "+code, err, codes.NotFound, "", "")
	}
}

// A tenant never sees, changes or deletes another tenant's link: to it the
// code does not exist. Codes are global, though: an alias another tenant
// holds is taken.
func TestTenantIsolation(t *testing.T) {
	e := newEnv(t)
	owner, other := as("acme"), as("globex")
	l, err := e.client.CreateLink(owner, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/acme", CustomAlias: "acme-only"})
	if err != nil {
		t.Fatal(err)
	}
	code := l.GetLink().GetCode()

	_, err = e.client.GetLink(other, &shortenerv1.GetLinkRequest{Code: code})
	wantStatus(t, "another tenant's get", err, codes.NotFound, "", "")
	_, err = e.client.UpdateLink(other, &shortenerv1.UpdateLinkRequest{
		Link: &shortenerv1.Link{Code: code, LongUrl: "https://evil.example"}, UpdateMask: mask("long_url")})
	wantStatus(t, "another tenant's update", err, codes.NotFound, "", "")
	_, err = e.client.DeleteLink(other, &shortenerv1.DeleteLinkRequest{Code: code})
	wantStatus(t, "another tenant's delete", err, codes.NotFound, "", "")
	list, err := e.client.ListLinks(other, &shortenerv1.ListLinksRequest{})
	if err != nil || len(list.GetLinks()) != 0 {
		t.Errorf("another tenant's list: %v, %v; want no links", list.GetLinks(), err)
	}
	_, err = e.client.CreateLink(other, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/g", CustomAlias: code})
	wantStatus(t, "another tenant's create of the alias", err, codes.AlreadyExists, linkapi.ReasonAliasTaken, "custom_alias")

	got, err := e.client.GetLink(owner, &shortenerv1.GetLinkRequest{Code: code})
	if err != nil || got.GetLink().GetLongUrl() != "https://example.com/acme" {
		t.Errorf("the owner's link after the other tenant's calls: %v, %v; want it unchanged", got.GetLink(), err)
	}
}

// A call without a tenant is UNAUTHENTICATED, unless anonymous creation is
// on: then it acts as tenant "anonymous".
func TestCallsWithoutATenant(t *testing.T) {
	_, err := newEnv(t).client.CreateLink(as(""), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com"})
	wantStatus(t, "create without a tenant", err, codes.Unauthenticated, rpcerr.ReasonTenantMissing, "")

	e := newEnv(t, func(o *linkapi.Options) { o.AllowAnonymous = true })
	l, err := e.client.CreateLink(as(""), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com"})
	if err != nil || l.GetLink().GetTenant() != "anonymous" {
		t.Errorf("anonymous create: %v, %v; want tenant anonymous", l.GetLink(), err)
	}
}

// Nobody holds a key for tenant "anonymous", so an alias taken anonymously
// could never be given up: a custom alias is refused to anonymous callers
// (PERMISSION_DENIED on custom_alias, saying what to do) and stays free for
// a tenant; an anonymous create without one still works.
func TestCustomAliasRefusedToAnonymousCallers(t *testing.T) {
	e := newEnv(t, func(o *linkapi.Options) { o.AllowAnonymous = true })
	for _, mode := range []shortenerv1.CodeMode{shortenerv1.CodeMode_CODE_MODE_UNSPECIFIED, shortenerv1.CodeMode_CODE_MODE_CUSTOM} {
		_, err := e.client.CreateLink(as(""), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/squat", CustomAlias: "pricing", Mode: mode})
		wantStatus(t, "anonymous create with an alias, mode "+mode.String(), err, codes.PermissionDenied, linkapi.ReasonAliasTenantRequired, "custom_alias")
		if msg := status.Convert(err).Message(); !strings.Contains(msg, "API key") || !strings.Contains(msg, "leave custom_alias out") {
			t.Errorf("refusal %q: want it to say an API key is needed, or to leave the alias out", msg)
		}
	}
	if _, err := e.client.CreateLink(as(""), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/squat"}); err != nil {
		t.Errorf("anonymous create without an alias: %v", err)
	}
	l, err := e.client.CreateLink(as("acme"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/pricing", CustomAlias: "pricing"})
	if err != nil || l.GetLink().GetCode() != "pricing" || l.GetLink().GetTenant() != "acme" {
		t.Errorf("a tenant's create of the alias after the anonymous attempts: %v, %v; want acme's link pricing", l.GetLink(), err)
	}
}

// A store that cannot be reached is UNAVAILABLE with a retry delay; its
// error text never reaches the client.
func TestUnreachableStoreIsUnavailable(t *testing.T) {
	e := newEnv(t)
	e.store.Fail(&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "secret-db-host", Name: "db"}})
	_, err := e.client.GetLink(as("acme"), &shortenerv1.GetLinkRequest{Code: "abcdef"})
	wantStatus(t, "get with the store down", err, codes.Unavailable, linkapi.ReasonStoreDown, "")
	if strings.Contains(status.Convert(err).Message(), "secret-db-host") {
		t.Errorf("the store's error reached the client: %v", err)
	}
}

// An expiry is kept to the microsecond, as PostgreSQL keeps it: a time with
// nanoseconds is not refused but cut to the microsecond before it, and the
// create, a read and an update all answer the time kept.
func TestExpiryIsKeptToTheMicrosecond(t *testing.T) {
	e := newEnv(t)
	ctx := as("acme")
	at := time.Now().Add(time.Hour).Truncate(time.Second).Add(123456789 * time.Nanosecond)
	kept := at.Truncate(time.Microsecond)
	l, err := e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/soon", ExpireTime: timestamppb.New(at)})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.GetLink().GetExpireTime().AsTime(); !got.Equal(kept) {
		t.Errorf("create: expiry %s, want %s", got.Format(time.RFC3339Nano), kept.Format(time.RFC3339Nano))
	}
	code := l.GetLink().GetCode()
	read, err := e.client.GetLink(ctx, &shortenerv1.GetLinkRequest{Code: code})
	if err != nil || !read.GetLink().GetExpireTime().AsTime().Equal(kept) {
		t.Errorf("read: %v, %v; want expiry %s", read.GetLink().GetExpireTime(), err, kept.Format(time.RFC3339Nano))
	}
	later := at.Add(time.Hour)
	up, err := e.client.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
		Link: &shortenerv1.Link{Code: code, ExpireTime: timestamppb.New(later)}, UpdateMask: mask("expire_time")})
	if err != nil || !up.GetLink().GetExpireTime().AsTime().Equal(later.Truncate(time.Microsecond)) {
		t.Errorf("update: %v, %v; want expiry %s", up.GetLink().GetExpireTime(), err, later.Truncate(time.Microsecond).Format(time.RFC3339Nano))
	}
}

// Aliases are case-sensitive, as docs/api.md says: another tenant can hold
// an alias that differs from one only in case, and the exact alias stays
// refused.
func TestAliasesDifferingInCaseAreTwoCodes(t *testing.T) {
	e := newEnv(t)
	if _, err := e.client.CreateLink(as("acme"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/brand", CustomAlias: "MyAlias"}); err != nil {
		t.Fatal(err)
	}
	other, err := e.client.CreateLink(as("globex"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/other", CustomAlias: "myAlias"})
	if err != nil || other.GetLink().GetCode() != "myAlias" {
		t.Errorf("another tenant's alias in other case: %v, %v; want the link myAlias", other, err)
	}
	_, err = e.client.CreateLink(as("globex"), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/other", CustomAlias: "MyAlias"})
	if status.Code(err) != codes.AlreadyExists {
		t.Errorf("another tenant's exact alias: %v, want AlreadyExists", err)
	}
}
