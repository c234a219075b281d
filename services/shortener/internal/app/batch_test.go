//go:build integration

package app

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkpass"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/services/shortener/internal/linkapi"
)

// budget is a limiter holding n links in all under rule "links-per-day": each
// CheckQuota is charged its cost (1 when unset), and one whose cost exceeds
// what is left is denied and charged nothing, as the limiter's rules do.
func budget(n int64) limitertest.Decider {
	var mu sync.Mutex
	left := n
	return func(req *ratelimitv1.CheckQuotaRequest) *ratelimitv1.CheckQuotaResponse {
		mu.Lock()
		defer mu.Unlock()
		cost := int64(1)
		if req.Cost != nil {
			cost = int64(req.GetCost())
		}
		resp := &ratelimitv1.CheckQuotaResponse{DecidingRule: "links-per-day", Limit: n,
			Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS}
		if cost > left {
			resp.Remaining = left
			resp.RetryAfter, resp.ResetAfter = durationpb.New(time.Hour), durationpb.New(time.Hour)
			return resp
		}
		left -= cost
		resp.Allowed, resp.Remaining = true, left
		return resp
	}
}

func linksOf(prefix string, n int) []*shortenerv1.CreateLinkRequest {
	reqs := make([]*shortenerv1.CreateLinkRequest, n)
	for i := range reqs {
		reqs[i] = &shortenerv1.CreateLinkRequest{LongUrl: fmt.Sprintf("https://example.com/%s/%d", prefix, i)}
	}
	return reqs
}

func countRows(t *testing.T, db *pgxpool.Pool, tenant, where string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM links WHERE tenant = $1 `+where, tenant).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestBatchSizeIsBounded: an empty batch and one of 1,001 are
// INVALID_ARGUMENT saying what a batch holds; neither reaches the limiter
// nor the database.
func TestBatchSizeIsBounded(t *testing.T) {
	tenant := uniq("bsz-")
	lim := limitertest.Start(t, limitertest.AllowAll)
	sh := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.Addr()}, hooks{})
	db, _ := stores(t, sh.cfg, tenant)
	for _, n := range []int{0, 1001} {
		_, err := sh.api.BatchCreateLinks(as(tenant, ""), &shortenerv1.BatchCreateLinksRequest{Requests: linksOf("size", n)})
		reason, st := wantStatus(t, err, codes.InvalidArgument)
		if reason != linkapi.ReasonBatchSizeInvalid || !strings.Contains(st.Message(), "a batch holds 1 to 1000 links") {
			t.Errorf("%d items: reason %q message %q", n, reason, st.Message())
		}
	}
	if calls := lim.Calls(); len(calls) != 0 {
		t.Errorf("limiter asked %d times for refused batches", len(calls))
	}
	if n := countRows(t, db, tenant, ""); n != 0 {
		t.Errorf("%d rows stored", n)
	}
	_, err := sh.api.BatchCreateLinks(context.Background(), &shortenerv1.BatchCreateLinksRequest{Requests: linksOf("anon", 1)})
	wantStatus(t, err, codes.Unauthenticated)
}

// TestBatchOf1000ItemsFailOnTheirOwn: in a batch of 1,000, exactly the bad
// items fail, each with its code and field; a taken alias is ALREADY_EXISTS
// without aborting the rest; every other item is stored in PostgreSQL and
// written through to Redis (passwords hashed); the limiter is asked once for
// the number of valid items; the rows go in one INSERT and the sequential
// codes cost one nextval.
func TestBatchOf1000ItemsFailOnTheirOwn(t *testing.T) {
	tenant, other := uniq("b1k-"), uniq("b1k-")
	lim := limitertest.Start(t, limitertest.AllowAll)
	nextvals := &queryCounter{substr: "nextval('link_block')"}
	inserts := &queryCounter{substr: "INSERT INTO links"}
	sh := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.Addr()}, hooks{pgTracer: tracers{nextvals, inserts}})
	db, rdb := stores(t, sh.cfg, tenant, other)

	taken := uniq("taken-")
	if _, err := sh.api.CreateLink(as(other, ""), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/t", CustomAlias: taken}); err != nil {
		t.Fatal(err)
	}
	fresh := uniq("fresh-")
	nextvals.n.Store(0)
	inserts.n.Store(0)
	calls := len(lim.Calls())

	reqs := linksOf("b", 1000)
	type want struct{ code, field string }
	bad := map[int]want{}
	set := func(i int, w want, f func(r *shortenerv1.CreateLinkRequest)) {
		f(reqs[i])
		if w.code != "" {
			bad[i] = w
		}
	}
	invalid := func(field string) want { return want{"INVALID_ARGUMENT", field} }
	set(7, invalid("long_url"), func(r *shortenerv1.CreateLinkRequest) { r.LongUrl = "javascript:alert(1)" })
	set(123, invalid("long_url"), func(r *shortenerv1.CreateLinkRequest) { r.LongUrl = "example.com/no-scheme" })
	set(500, invalid("long_url"), func(r *shortenerv1.CreateLinkRequest) { r.LongUrl = "http://127.0.0.1:9091/" })
	set(640, want{"ALREADY_EXISTS", "custom_alias"}, func(r *shortenerv1.CreateLinkRequest) { r.CustomAlias = taken })
	set(641, want{}, func(r *shortenerv1.CreateLinkRequest) { r.CustomAlias = fresh })
	set(642, want{"ALREADY_EXISTS", "custom_alias"}, func(r *shortenerv1.CreateLinkRequest) { r.CustomAlias = fresh })
	set(700, invalid("tags"), func(r *shortenerv1.CreateLinkRequest) { r.Tags = []string{"ok", "not ok"} })
	set(701, invalid("password"), func(r *shortenerv1.CreateLinkRequest) { r.Password = "short" })
	set(702, invalid("max_visits"), func(r *shortenerv1.CreateLinkRequest) { r.MaxVisits = -5 })
	set(703, invalid("device_targets.ios_url"), func(r *shortenerv1.CreateLinkRequest) {
		r.DeviceTargets = &shortenerv1.DeviceTargets{IosUrl: "javascript:alert(1)"}
	})
	set(704, invalid("expire_time"), func(r *shortenerv1.CreateLinkRequest) { r.ExpireTime = timestamppb.New(time.Now().Add(-time.Hour)) })
	set(950, invalid("custom_alias"), func(r *shortenerv1.CreateLinkRequest) {
		r.CustomAlias, r.Mode = uniq("x"), shortenerv1.CodeMode_CODE_MODE_RANDOM
	})
	for i := 800; i < 803; i++ {
		set(i, want{}, func(r *shortenerv1.CreateLinkRequest) {
			r.Password, r.MaxVisits, r.Tags = fmt.Sprintf("batch password %d", i), 7, []string{"Batch", "zeta", "batch", "alpha"}
			r.DeviceTargets = &shortenerv1.DeviceTargets{AndroidUrl: "https://play.example/app"}
		})
	}
	for i := 900; i < 905; i++ {
		set(i, want{}, func(r *shortenerv1.CreateLinkRequest) { r.Mode = shortenerv1.CodeMode_CODE_MODE_RANDOM })
	}

	resp, err := sh.api.BatchCreateLinks(as(tenant, "198.51.100.9"), &shortenerv1.BatchCreateLinksRequest{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetResults()) != len(reqs) {
		t.Fatalf("%d results, want %d", len(resp.GetResults()), len(reqs))
	}
	made := map[string]int{}
	for i, r := range resp.GetResults() {
		if r.GetIndex() != int32(i) {
			t.Errorf("result %d has index %d", i, r.GetIndex())
		}
		w, isBad := bad[i]
		switch {
		case isBad && (r.GetLink() != nil || r.GetError().GetCode() != w.code || r.GetError().GetField() != w.field || r.GetError().GetMessage() == ""):
			t.Errorf("item %d: %v, want error %s on %s", i, r, w.code, w.field)
		case !isBad && (r.GetError() != nil || r.GetLink().GetCode() == ""):
			t.Errorf("item %d: %v, want a link", i, r)
		case !isBad:
			made[r.GetLink().GetCode()] = i
			if r.GetLink().GetPassword() != "" || r.GetLink().GetLongUrl() != reqs[i].GetLongUrl() || r.GetLink().GetTenant() != tenant {
				t.Errorf("item %d: link %v", i, r.GetLink())
			}
		}
	}
	if want := len(reqs) - len(bad); int(resp.GetCreated()) != want || len(made) != want {
		t.Errorf("created %d (%d distinct codes), want %d", resp.GetCreated(), len(made), want)
	}
	if got := resp.GetResults()[641].GetLink().GetCode(); got != fresh {
		t.Errorf("custom alias item: code %q, want %q", got, fresh)
	}
	for i := 900; i < 905; i++ {
		if len(resp.GetResults()[i].GetLink().GetCode()) != 7 {
			t.Errorf("random item %d: code %q", i, resp.GetResults()[i].GetLink().GetCode())
		}
	}

	rows, err := db.Query(context.Background(), `SELECT code FROM links WHERE tenant = $1`, tenant)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]bool{}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		stored[c] = true
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(stored) != len(made) {
		t.Errorf("%d rows stored for the tenant, want %d", len(stored), len(made))
	}
	for c := range made {
		if !stored[c] {
			t.Errorf("created %s is not in PostgreSQL", c)
		}
	}

	pipe := rdb.Pipeline()
	gets := map[string]interface{ Result() (string, error) }{}
	for c := range made {
		gets[c] = pipe.Get(context.Background(), linkcache.Key(c))
	}
	if _, err := pipe.Exec(context.Background()); err != nil {
		t.Fatalf("redis entries of the batch: %v", err)
	}
	for c, g := range gets {
		s, _ := g.Result()
		e, err := linkcache.Unmarshal(s)
		if i := made[c]; err != nil || e.State != linkcache.Active || e.URL != reqs[i].GetLongUrl() || e.Tenant != tenant {
			t.Errorf("redis entry of item %d (%s): %+v, %v", i, c, e, err)
		}
	}
	for i := 800; i < 803; i++ {
		l := resp.GetResults()[i].GetLink()
		wantTags := []string{"batch", "zeta", "alpha"}
		if !l.GetPasswordProtected() || l.GetMaxVisits() != 7 || l.GetDeviceTargets().GetAndroidUrl() != "https://play.example/app" || !slices.Equal(l.GetTags(), wantTags) {
			t.Errorf("item %d: %v", i, l)
		}
		r := readRow(t, db, l.GetCode())
		if !slices.Equal(r.tags, wantTags) || r.maxVisits != 7 {
			t.Errorf("item %d: stored tags %q, max_visits %d; want %q, 7", i, r.tags, r.maxVisits, wantTags)
		}
		if r.hash == nil || !strings.HasPrefix(*r.hash, "$argon2id$") {
			t.Fatalf("item %d: stored hash %v", i, r.hash)
		}
		if ok, err := linkpass.Verify(*r.hash, reqs[i].GetPassword()); !ok || err != nil {
			t.Errorf("item %d: stored hash does not verify: %v", i, err)
		}
		e := cacheEntry(t, rdb, l.GetCode())
		if e.PasswordHash != *r.hash || e.MaxVisits != 7 || e.Targets == nil || e.Targets.Android != "https://play.example/app" {
			t.Errorf("item %d: redis entry %+v", i, e)
		}
	}

	got := lim.Calls()[calls:]
	if valid := uint32(len(reqs) - len(bad)); len(got) != 1 || got[0].GetDomain() != "links.create" || got[0].GetCost() != valid ||
		got[0].GetDescriptors()["tenant"] != tenant || got[0].GetDescriptors()["ip"] != "198.51.100.9" {
		t.Errorf("limiter calls %v, want one links.create of cost %d (every valid item, not the alias another tenant holds)", got, valid)
	}
	if n := nextvals.n.Load(); n != 1 {
		t.Errorf("%d nextval('link_block') statements for the batch, want 1", n)
	}
	if n := inserts.n.Load(); n != 1 {
		t.Errorf("%d INSERT statements for the batch, want 1", n)
	}
}

// TestBatchOfSequentialCodesTakesOneBlock: after one CreateLink (which takes
// a block of 1,000 and uses one ID), a batch of 1,000 sequential links uses
// the 999 IDs left and one more block, fetched in a single nextval round
// trip; the IDs are distinct and all in those two blocks.
func TestBatchOfSequentialCodesTakesOneBlock(t *testing.T) {
	const blockSize = 1000
	tenant := uniq("bsq-")
	nextvals := &queryCounter{substr: "nextval('link_block')"}
	inserts := &queryCounter{substr: "INSERT INTO links"}
	sh := start(t, nil, hooks{pgTracer: tracers{nextvals, inserts}})
	db, _ := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")

	firstID := firstBlockID(ctx, t, sh)
	if n := nextvals.n.Load(); n != 1 {
		t.Fatalf("first link after %d nextvals, want 1", n)
	}
	var seqBefore int64
	if err := db.QueryRow(context.Background(), `SELECT last_value FROM link_block`).Scan(&seqBefore); err != nil {
		t.Fatal(err)
	}
	inserts.n.Store(0)

	resp, err := sh.api.BatchCreateLinks(ctx, &shortenerv1.BatchCreateLinksRequest{Requests: linksOf("seq", 1000)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetCreated() != 1000 {
		t.Fatalf("created %d, want 1000", resp.GetCreated())
	}
	if n := nextvals.n.Load(); n != 2 {
		t.Errorf("%d nextval round trips in all, want 2 (one for the first link, one for the batch)", n)
	}
	if n := inserts.n.Load(); n != 1 {
		t.Errorf("%d INSERT statements for the batch, want 1", n)
	}
	if got := metricValue(t, sh.Running, "kurz_shortener_code_blocks_fetched_total"); got != 2 {
		t.Errorf("code_blocks_fetched %v, want 2", got)
	}
	var seqAfter int64
	if err := db.QueryRow(context.Background(), `SELECT last_value FROM link_block`).Scan(&seqAfter); err != nil {
		t.Fatal(err)
	}
	if seqAfter <= seqBefore { // others may share the sequence: only that it moved holds
		t.Errorf("link_block %d -> %d, want it advanced", seqBefore, seqAfter)
	}
	seen := map[int64]bool{firstID: true}
	blocks := map[int64]bool{firstID / blockSize: true}
	for i, r := range resp.GetResults() {
		id, ok := testCodes.ID(r.GetLink().GetCode())
		if !ok || seen[id] {
			t.Fatalf("item %d: code %q (sequential %v, repeated %v)", i, r.GetLink().GetCode(), ok, seen[id])
		}
		seen[id] = true
		blocks[id/blockSize] = true
	}
	if len(blocks) != 2 {
		t.Errorf("the first link and the batch span %d blocks, want 2", len(blocks))
	}
	if id, _ := testCodes.ID(resp.GetResults()[0].GetLink().GetCode()); id != firstID+1 {
		t.Errorf("the batch starts at ID %d, want %d: the rest of the current block first", id, firstID+1)
	}
}

// TestBatchQuotaChargedByCount: a batch is charged as many links as it has
// valid items, in one call; when that is more than what is left it is
// RESOURCE_EXHAUSTED saying how many links it asked for, and nothing of it
// is created.
func TestBatchQuotaChargedByCount(t *testing.T) {
	tenant := uniq("bqu-")
	lim := limitertest.Start(t, budget(5))
	sh := start(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.Addr()}, hooks{})
	db, _ := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")
	batch := func(reqs []*shortenerv1.CreateLinkRequest) (*shortenerv1.BatchCreateLinksResponse, error) {
		return sh.api.BatchCreateLinks(ctx, &shortenerv1.BatchCreateLinksRequest{Requests: reqs})
	}

	if _, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/one"}); err != nil {
		t.Fatal(err)
	}
	if resp, err := batch(linksOf("three", 3)); err != nil || resp.GetCreated() != 3 {
		t.Fatalf("batch of 3 with 4 left: %v, %v", resp, err)
	}
	_, err := batch(linksOf("two", 2))
	reason, st := wantStatus(t, err, codes.ResourceExhausted)
	if reason != rpcerr.ReasonRateLimited || !strings.Contains(st.Message(), "batch of 2 links") || !strings.Contains(st.Message(), "links-per-day") {
		t.Errorf("batch of 2 with 1 left: reason %q message %q", reason, st.Message())
	}
	if n := countRows(t, db, tenant, `AND long_url LIKE 'https://example.com/two/%'`); n != 0 {
		t.Errorf("the denied batch stored %d rows, want 0", n)
	}

	mixed := linksOf("mixed", 3)
	mixed[1].LongUrl = "javascript:alert(1)"
	mixed[2].Tags = []string{"no spaces"}
	resp, err := batch(mixed)
	if err != nil || resp.GetCreated() != 1 || resp.GetResults()[1].GetError().GetField() != "long_url" {
		t.Fatalf("one valid item of three with 1 left: %v, %v", resp, err)
	}
	before := len(lim.Calls())
	resp, err = batch(mixed[1:])
	if err != nil || resp.GetCreated() != 0 || len(lim.Calls()) != before {
		t.Errorf("a batch of invalid items only: %v, %v, limiter asked %d times; want no links and no limiter call", resp, err, len(lim.Calls())-before)
	}

	var costs []uint32
	for _, c := range lim.Calls() {
		costs = append(costs, c.GetCost())
	}
	if fmt.Sprint(costs) != "[1 3 2 1]" {
		t.Errorf("limiter charged %v, want [1 3 2 1]", costs)
	}
	if n := countRows(t, db, tenant, ""); n != 5 {
		t.Errorf("%d links stored, want the 5 the quota allowed", n)
	}
}
