//go:build integration

package app

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/services/shortener/internal/codegen"
	"kurz.dev/services/shortener/internal/linkapi"
)

// TestBlockAllocation: two shortener instances, many goroutines, 10,000
// links. No code is handed out twice, every code is 7 characters, and each
// instance takes exactly one block (one nextval) per 1,000 links it made.
func TestBlockAllocation(t *testing.T) {
	const total, workers, blockSize = 10_000, 64, 1000
	tenant := uniq("blk-")
	var nextvals [2]*queryCounter
	var inst [2]instance
	for i := range inst {
		nextvals[i] = &queryCounter{substr: "nextval('link_block')"}
		// 32 goroutines per instance queue for 16 connections, and the pool
		// wait counts against the statement timeout: on a loaded machine
		// (-race, 2 shared cores) the 2s default fails calls this test is not
		// about. It asserts allocation, not latency.
		inst[i] = start(t, map[string]string{"KURZ_SHORTENER_BLOCK_SIZE": strconv.Itoa(blockSize), "KURZ_POSTGRES_QUERY_TIMEOUT": "60s"},
			hooks{pgTracer: nextvals[i]})
	}
	db, _ := stores(t, inst[0].cfg, tenant)
	ctx := as(tenant, "198.51.100.1")

	var seqBefore int64
	if err := db.QueryRow(context.Background(), `SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM link_block`).Scan(&seqBefore); err != nil {
		t.Fatal(err)
	}

	var issued atomic.Int64
	var made [2]atomic.Int64
	codesByInst := [2]sync.Map{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			i := w % 2
			for issued.Add(1) <= total {
				resp, err := inst[i].api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/blk/" + strconv.Itoa(w)})
				if err != nil {
					errs <- err
					return
				}
				made[i].Add(1)
				if _, dup := codesByInst[i].LoadOrStore(resp.GetLink().GetCode(), true); dup {
					t.Errorf("instance %d handed out %s twice", i, resp.GetLink().GetCode())
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("CreateLink: %v", err)
	}

	all := map[string]int{}
	blocksOf := [2]map[int64]bool{{}, {}}
	for i := range inst {
		codesByInst[i].Range(func(k, _ any) bool {
			code := k.(string)
			if prev, dup := all[code]; dup {
				t.Errorf("code %s handed out by instance %d and instance %d", code, prev, i)
			}
			all[code] = i
			id, ok := testCodes.ID(code)
			if !ok {
				t.Errorf("code %q is not a 7-character block code", code)
			}
			blocksOf[i][id/blockSize] = true
			return true
		})
	}
	if len(all) != total {
		t.Errorf("%d distinct codes, want %d", len(all), total)
	}
	var rows int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM links WHERE tenant = $1`, tenant).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != total {
		t.Errorf("%d rows stored, want %d", rows, total)
	}
	for i := range inst {
		n := made[i].Load()
		want := (n + blockSize - 1) / blockSize
		if got := nextvals[i].n.Load(); got != want {
			t.Errorf("instance %d made %d links with %d nextval calls, want %d (one per %d)", i, n, got, want, blockSize)
		}
		if got := int64(len(blocksOf[i])); got != want {
			t.Errorf("instance %d used %d blocks, want %d", i, got, want)
		}
		if got := metricValue(t, inst[i].Running, "kurz_shortener_code_blocks_fetched_total"); int64(got) != want {
			t.Errorf("instance %d: metric code_blocks_fetched %v, want %d", i, got, want)
		}
		for b := range blocksOf[i] {
			if blocksOf[1-i][b] {
				t.Errorf("block %d used by both instances", b)
			}
		}
	}
	var seqAfter int64
	if err := db.QueryRow(context.Background(), `SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM link_block`).Scan(&seqAfter); err != nil {
		t.Fatal(err)
	}
	// Other test runs may share the sequence, so only a lower bound holds.
	if min := nextvals[0].n.Load() + nextvals[1].n.Load(); seqAfter-seqBefore < min {
		t.Errorf("link_block moved by %d, want at least %d", seqAfter-seqBefore, min)
	}
	t.Logf("instances made %d and %d links with %d and %d nextval calls; link_block %d -> %d",
		made[0].Load(), made[1].Load(), nextvals[0].n.Load(), nextvals[1].n.Load(), seqBefore, seqAfter)
}

// TestDefaultCodesCannotBeWalked: the default (block) codes of links made
// one after the other are 7 base62 characters and none is a neighbour of
// the one before (within 62 as base62 numbers), as sequential codes were: a
// code does not lead to the next one.
func TestDefaultCodesCannotBeWalked(t *testing.T) {
	tenant := uniq("walk-")
	sh := start(t, nil, hooks{})
	stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")
	prev := int64(-1)
	for i := range 20 {
		resp, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/w/" + strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		code := resp.GetLink().GetCode()
		n, ok := linkcode.Decode(code)
		if !ok || len(code) != linkcode.SequentialLength {
			t.Fatalf("code %q: want 7 base62 characters", code)
		}
		if d := n - prev; prev >= 0 && d >= -62 && d <= 62 {
			t.Errorf("link %d has code %q, %d from the previous link's: walkable", i, code, d)
		}
		prev = n
	}
}

// seeded is a deterministic random source, so the test knows which codes
// the shortener will draw (and can make them collide).
func seeded(seed uint64) *rand.ChaCha8 {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	return rand.NewChaCha8(s)
}

// TestRandomCollisions forces a short code length and a seeded source, takes
// the codes the shortener is about to draw, and checks that collisions are
// retried, that the sixth consecutive collision fails cleanly, and that the
// metrics count them.
func TestRandomCollisions(t *testing.T) {
	const length = 4
	seed := rand.Uint64()
	tenant := uniq("rnd-")
	sh := start(t, map[string]string{"KURZ_SHORTENER_RANDOM_CODE_LENGTH": strconv.Itoa(length)}, hooks{random: seeded(seed)})
	db, _ := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "198.51.100.2")

	predict := codegen.NewRandom(seeded(seed), length)
	next := make([]string, 9)
	for i := range next {
		c, err := predict.Code()
		if err != nil {
			t.Fatal(err)
		}
		next[i] = c
	}
	take := func(codes ...string) {
		for _, c := range codes {
			if _, err := db.Exec(context.Background(),
				`INSERT INTO links (code, tenant, long_url) VALUES ($1, $2, 'https://example.com/taken')`, c, tenant); err != nil {
				t.Fatalf("take %s (another run holds it? rerun): %v", c, err)
			}
		}
	}

	take(next[0], next[1])
	resp, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/r", Mode: shortenerv1.CodeMode_CODE_MODE_RANDOM})
	if err != nil {
		t.Fatalf("CreateLink after 2 collisions: %v", err)
	}
	if got := resp.GetLink().GetCode(); got != next[2] || len(got) != length {
		t.Fatalf("code %q, want the third draw %q", got, next[2])
	}
	if got := metricValue(t, sh.Running, "kurz_shortener_random_code_retries_total"); got != 2 {
		t.Errorf("retries metric %v, want 2", got)
	}

	take(next[3:]...) // the next six draws all collide
	_, err = sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/r2", Mode: shortenerv1.CodeMode_CODE_MODE_RANDOM})
	reason, st := wantStatus(t, err, codes.Unavailable)
	if reason != linkapi.ReasonCodesExhausted {
		t.Errorf("reason %q, want %s", reason, linkapi.ReasonCodesExhausted)
	}
	t.Logf("sixth collision: %s: %s", st.Code(), st.Message())
	if got := metricValue(t, sh.Running, "kurz_shortener_random_code_retries_total"); got != 2+5 {
		t.Errorf("retries metric %v, want 7 (2 + 5)", got)
	}
	if got := metricValue(t, sh.Running, "kurz_shortener_random_code_exhausted_total"); got != 1 {
		t.Errorf("exhausted metric %v, want 1", got)
	}
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM links WHERE tenant = $1 AND long_url = 'https://example.com/r2'`, tenant).Scan(&n); err != nil || n != 0 {
		t.Errorf("failed create stored %d rows (%v), want none", n, err)
	}

	// With the default length and crypto/rand, random codes are 7 characters
	// and not sequential neighbours.
	def := start(t, nil, hooks{})
	r, err := def.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/c", Mode: shortenerv1.CodeMode_CODE_MODE_RANDOM})
	if err != nil || len(r.GetLink().GetCode()) != 7 {
		t.Fatalf("default random: %v, %v", r, err)
	}
}

// TestAliases: custom aliases are validated, reserved words refused, taken
// aliases ALREADY_EXISTS (but for the tenant's own link of that alias to
// the same URL: the same create again answers it, not created), and a
// sequential ID whose code an alias holds is skipped.
func TestAliases(t *testing.T) {
	tenant := uniq("als-")
	sh := start(t, nil, hooks{})
	stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")
	create := func(alias string) error {
		_, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/alias", CustomAlias: alias})
		return err
	}

	alias := uniq("my-launch-")
	made, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/alias", CustomAlias: alias})
	if err != nil || !made.GetCreated() {
		t.Fatalf("create alias: %v, %v", made, err)
	}
	// The same create again (a retry whose first answer was lost): the
	// tenant's link, not created.
	again, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/alias", CustomAlias: alias})
	if err != nil || again.GetCreated() || again.GetLink().GetCode() != made.GetLink().GetCode() {
		t.Errorf("the same create again: %v, %v; want the same link, not created", again, err)
	}
	_, err = sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/another", CustomAlias: alias})
	reason, _ := wantStatus(t, err, codes.AlreadyExists)
	if reason != linkapi.ReasonAliasTaken {
		t.Errorf("taken alias reason %q", reason)
	}
	_, err = sh.api.CreateLink(as(uniq("als-other-"), ""), &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/alias", CustomAlias: alias})
	if reason, _ := wantStatus(t, err, codes.AlreadyExists); reason != linkapi.ReasonAliasTaken {
		t.Errorf("another tenant's create of the alias, same URL: reason %q, want %s", reason, linkapi.ReasonAliasTaken)
	}
	for alias, want := range map[string]string{
		"healthz": linkapi.ReasonAliasReserved, "Metrics": linkapi.ReasonAliasReserved, "v1xx": "",
		"ab": linkapi.ReasonAliasInvalid, "has space": linkapi.ReasonAliasInvalid, "-dash": linkapi.ReasonAliasInvalid,
	} {
		if want == "" {
			continue
		}
		reason, _ := wantStatus(t, create(alias), codes.InvalidArgument)
		if reason != want {
			t.Errorf("alias %q: reason %q, want %s", alias, reason, want)
		}
	}
	_, err = sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/", CustomAlias: uniq("x"), Mode: shortenerv1.CodeMode_CODE_MODE_RANDOM})
	wantStatus(t, err, codes.InvalidArgument)

	// The next block code, taken by an alias, is skipped.
	first, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/s1"})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := testCodes.ID(first.GetLink().GetCode())
	held, _ := testCodes.Code(id + 1)
	if err := create(held); err != nil {
		t.Fatalf("alias %s: %v", held, err)
	}
	second, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/s2"})
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := testCodes.Code(id + 2); second.GetLink().GetCode() != want {
		t.Errorf("after %s and alias %s: got %s, want %s", first.GetLink().GetCode(), held, second.GetLink().GetCode(), want)
	}
	if got := metricValue(t, sh.Running, "kurz_shortener_sequential_code_skipped_total"); got != 1 {
		t.Errorf("skipped metric %v, want 1", got)
	}
}

// TestBlockCodesSkipCodesOfOlderLinks: block codes are permuted IDs now, so
// the code of a new ID can be one a link already holds: one the old
// sequential scheme gave (base62 of ID + 62^6), or an alias. The unique code
// keeps the older link; the new one takes the next ID, alone and in a batch,
// and each skip is counted.
func TestBlockCodesSkipCodesOfOlderLinks(t *testing.T) {
	tenant := uniq("old-")
	sh := start(t, nil, hooks{})
	db, _ := stores(t, sh.cfg, tenant)
	ctx := as(tenant, "")
	id := firstBlockID(ctx, t, sh)
	codeOf := func(id int64) string {
		c, err := testCodes.Code(id)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// legacy stores a link as the old scheme did, under the block code of
	// id: a code whose first digit is not 0 is the sequential code of ID
	// base62(code) - 62^6, which the old scheme gave.
	legacy := func(id int64) {
		t.Helper()
		code := codeOf(id)
		if n, _ := linkcode.Decode(code); n >= linkcode.SequentialOffset {
			old, _ := linkcode.Sequential(n - linkcode.SequentialOffset)
			t.Logf("ID %d's code %s is old ID %d's sequential code %s", id, code, n-linkcode.SequentialOffset, old)
		}
		if _, err := db.Exec(context.Background(),
			`INSERT INTO links (code, tenant, long_url) VALUES ($1, $2, 'https://example.com/legacy')`, code, tenant); err != nil {
			t.Fatalf("legacy link %s: %v", code, err)
		}
	}
	legacy(id + 1)
	if _, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/alias", CustomAlias: codeOf(id + 2)}); err != nil {
		t.Fatalf("alias %s: %v", codeOf(id+2), err)
	}

	next, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/o3"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := next.GetLink().GetCode(), codeOf(id+3); got != want {
		t.Errorf("CreateLink after two taken codes: %s, want %s (ID %d)", got, want, id+3)
	}

	legacy(id + 5)
	resp, err := sh.api.BatchCreateLinks(ctx, &shortenerv1.BatchCreateLinksRequest{Requests: linksOf("old", 3)})
	if err != nil {
		t.Fatal(err)
	}
	// The item that met the taken code gets the next free ID in a later round.
	got := map[string]bool{}
	for _, r := range resp.GetResults() {
		got[r.GetLink().GetCode()] = true
	}
	if want := []string{codeOf(id + 4), codeOf(id + 6), codeOf(id + 7)}; len(got) != 3 || !got[want[0]] || !got[want[1]] || !got[want[2]] {
		t.Errorf("batch codes %v, want %v (IDs %d, %d and %d)", got, want, id+4, id+6, id+7)
	}
	if got := metricValue(t, sh.Running, "kurz_shortener_sequential_code_skipped_total"); got != 3 {
		t.Errorf("skipped metric %v, want 3", got)
	}
	var legacyURLs int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM links WHERE code = ANY($1) AND long_url = 'https://example.com/legacy'`,
		[]string{codeOf(id + 1), codeOf(id + 5)}).Scan(&legacyURLs); err != nil || legacyURLs != 2 {
		t.Errorf("%d legacy links still lead where they did (%v), want 2", legacyURLs, err)
	}
}
