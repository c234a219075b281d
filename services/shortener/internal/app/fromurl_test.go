//go:build integration

package app

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/services/shortener/internal/linkapi"
)

const fromURL = shortenerv1.CodeMode_CODE_MODE_FROM_URL

// Concurrent creates of one URL from the URL make one link on PostgreSQL:
// every caller gets its code, exactly one is told it created it, and the
// quota is spent for that one (plus racers that lost after asking).
func TestFromURLConcurrentCreatesMakeOneLink(t *testing.T) {
	tenant := uniq("fu-")
	lim := limitertest.Start(t, limitertest.AllowAll)
	sh := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.Addr()}, hooks{})
	db, _ := stores(t, sh.cfg, tenant)

	created, code := concurrentFromURL(t, sh, tenant, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/race", Mode: fromURL}, 16)
	if created != 1 {
		t.Errorf("%d callers were told they created the link, want 1", created)
	}
	if n := countRows(t, db, tenant, ""); n != 1 {
		t.Errorf("%d rows for the URL, want 1", n)
	}

	// A repeat after the race needs no quota: a limiter that denies
	// everything does not stop it.
	lim.SetDecider(budget(0))
	again, err := sh.api.CreateLink(as(tenant, ""), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/race", Mode: fromURL})
	if err != nil || again.GetCreated() || again.GetLink().GetCode() != code {
		t.Errorf("a repeat with no quota left: %v, %v; want the link, not created", again, err)
	}
}

// A batch creates each URL once: an item whose link exists, or that repeats
// an earlier item's URL, returns that link (created false) and costs no
// quota; the others are created.
func TestBatchFromURL(t *testing.T) {
	tenant := uniq("fub-")
	lim := limitertest.Start(t, limitertest.AllowAll)
	sh := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.Addr()}, hooks{})
	db, _ := stores(t, sh.cfg, tenant)
	existing, err := sh.api.CreateLink(as(tenant, ""), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/a", Mode: fromURL})
	if err != nil {
		t.Fatal(err)
	}
	lim.SetDecider(budget(2)) // the two new links, no more
	item := func(long string, mode shortenerv1.CodeMode) *shortenerv1.CreateLinkRequest {
		return &shortenerv1.CreateLinkRequest{LongUrl: long, Mode: mode}
	}
	resp, err := sh.api.BatchCreateLinks(as(tenant, ""), &shortenerv1.BatchCreateLinksRequest{Requests: []*shortenerv1.CreateLinkRequest{
		item("https://example.com/a", fromURL),
		item("https://example.com/b", fromURL),
		item("https://example.com/b", fromURL),
		item("https://example.com/b", shortenerv1.CodeMode_CODE_MODE_SEQUENTIAL),
		item("ftp://example.com/c", fromURL),
	}})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.GetResults()
	if r[0].GetCreated() || r[0].GetLink().GetCode() != existing.GetLink().GetCode() {
		t.Errorf("item 0, an existing link's URL: %v", r[0])
	}
	if !r[1].GetCreated() || r[1].GetLink().GetCode() == "" {
		t.Errorf("item 1, a new URL: %v", r[1])
	}
	if r[2].GetCreated() || r[2].GetLink().GetCode() != r[1].GetLink().GetCode() {
		t.Errorf("item 2, item 1's URL again: %v", r[2])
	}
	if !r[3].GetCreated() || r[3].GetLink().GetCode() == r[1].GetLink().GetCode() {
		t.Errorf("item 3, a sequential link of item 1's URL: %v", r[3])
	}
	if r[4].GetCreated() || r[4].GetError() == nil {
		t.Errorf("item 4, a bad URL: %v", r[4])
	}
	if resp.GetCreated() != 2 || countRows(t, db, tenant, "") != 3 {
		t.Errorf("created %d (want 2), rows %d (want 3)", resp.GetCreated(), countRows(t, db, tenant, ""))
	}
}

// Anonymous callers share tenant "anonymous", so codes from the URL are
// refused to them in a batch as in CreateLink: each such item fails on its
// own with PERMISSION_DENIED on mode (a repeat of its URL too), and nothing
// is stored from the URL.
func TestBatchFromURLRefusedToAnonymousCallers(t *testing.T) {
	sh := start(t, map[string]string{"KURZ_SHORTENER_ALLOW_ANONYMOUS": "true"}, hooks{})
	db, _ := stores(t, sh.cfg)
	long := "https://example.com/" + uniq("anon-fu-")
	t.Cleanup(func() {
		// Only this test's rows: other tests make links of tenant anonymous too.
		_, _ = db.Exec(context.Background(), `DELETE FROM links WHERE tenant = 'anonymous' AND long_url = $1`, long)
	})
	_, err := sh.api.CreateLink(context.Background(), &shortenerv1.CreateLinkRequest{LongUrl: long, Mode: fromURL})
	if reason, _ := wantStatus(t, err, codes.PermissionDenied); reason != linkapi.ReasonFromURLTenantRequired {
		t.Errorf("anonymous create from the URL: reason %q, want %s", reason, linkapi.ReasonFromURLTenantRequired)
	}
	resp, err := sh.api.BatchCreateLinks(context.Background(), &shortenerv1.BatchCreateLinksRequest{Requests: []*shortenerv1.CreateLinkRequest{
		{LongUrl: long, Mode: fromURL},
		{LongUrl: long, Mode: fromURL},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.GetResults() {
		if r.GetCreated() || r.GetLink() != nil || r.GetError().GetCode() != "PERMISSION_DENIED" || r.GetError().GetField() != "mode" {
			t.Errorf("item %d: %v; want a PERMISSION_DENIED error on mode, no link", i, r)
		}
	}
	var rows int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM links WHERE tenant = 'anonymous' AND long_url = $1`, long).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if resp.GetCreated() != 0 || rows != 0 {
		t.Errorf("created %d, rows %d; want none", resp.GetCreated(), rows)
	}
}

// A tenant's link of a URL that it disabled is not returned by creates from
// the URL any more: concurrent creates of the URL make one new, working
// link (exactly one caller is told it created it, every caller gets its
// code), the disabled one keeps answering gone, and the tenant keeps one
// link that holds the URL.
func TestFromURLReplacesADisabledLink(t *testing.T) {
	tenant := uniq("fud-")
	sh := start(t, nil, hooks{})
	db, rdb := stores(t, sh.cfg, tenant)
	const long = "https://example.com/retired"
	old, err := sh.api.CreateLink(as(tenant, ""), &shortenerv1.CreateLinkRequest{LongUrl: long, Mode: fromURL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sh.api.UpdateLink(as(tenant, ""), &shortenerv1.UpdateLinkRequest{
		Link:       &shortenerv1.Link{Code: old.GetLink().GetCode(), Disabled: true},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"disabled"}},
	}); err != nil {
		t.Fatal(err)
	}

	created, code := concurrentFromURL(t, sh, tenant, &shortenerv1.CreateLinkRequest{LongUrl: long, Mode: fromURL}, 16)
	if created != 1 || code == old.GetLink().GetCode() {
		t.Errorf("%d callers created a link, code %s (the disabled one %s); want one new link", created, code, old.GetLink().GetCode())
	}
	if n := countRows(t, db, tenant, "AND url_key IS NOT NULL"); n != 1 {
		t.Errorf("%d links of the tenant hold the URL, want 1", n)
	}
	if n := countRows(t, db, tenant, "AND disabled"); n != 1 {
		t.Errorf("%d disabled links, want the old one", n)
	}
	if e := cacheEntry(t, rdb, code); e.State != linkcache.Active {
		t.Errorf("the new link's redis entry %+v, want active", e)
	}
	if e := cacheEntry(t, rdb, old.GetLink().GetCode()); e.State != linkcache.Gone {
		t.Errorf("the disabled link's redis entry %+v, want gone", e)
	}
}

// concurrentFromURL makes n concurrent creates of req (CODE_MODE_FROM_URL)
// and returns how many were told they created the link, and its code,
// which every caller must have got, working.
func concurrentFromURL(t *testing.T, sh instance, tenant string, req *shortenerv1.CreateLinkRequest, n int) (created int, code string) {
	t.Helper()
	var wg sync.WaitGroup
	resps := make([]*shortenerv1.CreateLinkResponse, n)
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			resps[i], errs[i] = sh.api.CreateLink(as(tenant, ""), proto.CloneOf(req))
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if resps[i].GetCreated() {
			created++
		}
		if code == "" {
			code = resps[i].GetLink().GetCode()
		}
		if got := resps[i].GetLink(); got.GetCode() != code || got.GetDisabled() {
			t.Errorf("caller %d got %v; want the working link %s", i, got, code)
		}
	}
	return created, code
}

// A visit-limited link made from the URL whose visits the redirect spent
// (its Redis counter at max_visits) gives the URL up: concurrent creates
// make one new link, and the tenant keeps one link that holds the URL.
func TestFromURLReplacesALinkWhoseVisitsAreSpent(t *testing.T) {
	tenant := uniq("fuv-")
	sh := start(t, nil, hooks{})
	db, rdb := stores(t, sh.cfg, tenant)
	const long = "https://example.com/limited"
	limited := &shortenerv1.CreateLinkRequest{LongUrl: long, Mode: fromURL, MaxVisits: 3}
	_, old := concurrentFromURL(t, sh, tenant, limited, 1)
	if err := rdb.Set(t.Context(), linkcache.VisitsKey(old), 3, 0).Err(); err != nil {
		t.Fatal(err)
	}
	created, code := concurrentFromURL(t, sh, tenant, limited, 16)
	if created != 1 || code == old {
		t.Errorf("%d callers created a link, code %s (the spent one %s); want one new link", created, code, old)
	}
	if n := countRows(t, db, tenant, "AND url_key IS NOT NULL"); n != 1 {
		t.Errorf("%d links of the tenant hold the URL, want 1", n)
	}
	if n := countRows(t, db, tenant, ""); n != 2 {
		t.Errorf("%d links of the tenant, want 2 (the spent one kept)", n)
	}

	// A batch item of the URL meets the same rule.
	if err := rdb.Set(t.Context(), linkcache.VisitsKey(code), 3, 0).Err(); err != nil {
		t.Fatal(err)
	}
	batch, err := sh.api.BatchCreateLinks(as(tenant, ""), &shortenerv1.BatchCreateLinksRequest{
		Requests: []*shortenerv1.CreateLinkRequest{{LongUrl: long, Mode: fromURL, MaxVisits: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	if r := batch.GetResults()[0]; !r.GetCreated() || r.GetLink().GetCode() == code || r.GetLink().GetCode() == old {
		t.Errorf("a batch item after the second link's visits were spent: %v; want a third link", r)
	}
}

// A link's URL key goes with its long_url whoever changes it: a writer
// that does not clear it (a shortener from before the key, SQL) must not
// leave the link handed out for the URL it no longer redirects to.
func TestFromURLNeverHandsOutALinkForAnotherURL(t *testing.T) {
	tenant := uniq("fuk-")
	sh := start(t, nil, hooks{})
	db, _ := stores(t, sh.cfg, tenant)
	const long = "https://example.com/first"
	made, err := sh.api.CreateLink(as(tenant, ""), &shortenerv1.CreateLinkRequest{LongUrl: long, Mode: fromURL})
	if err != nil {
		t.Fatal(err)
	}
	// An old writer's update: long_url only.
	if _, err := db.Exec(context.Background(), `UPDATE links SET long_url = 'https://example.com/elsewhere' WHERE tenant = $1 AND code = $2`,
		tenant, made.GetLink().GetCode()); err != nil {
		t.Fatal(err)
	}
	again, err := sh.api.CreateLink(as(tenant, ""), &shortenerv1.CreateLinkRequest{LongUrl: long, Mode: fromURL})
	if err != nil {
		t.Fatal(err)
	}
	if again.GetLink().GetCode() == made.GetLink().GetCode() || again.GetLink().GetLongUrl() != long || !again.GetCreated() {
		t.Errorf("the URL again after its link was pointed elsewhere: %s to %s (created %v); want a new link to %s",
			again.GetLink().GetCode(), again.GetLink().GetLongUrl(), again.GetCreated(), long)
	}
}
