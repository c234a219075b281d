package resolve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkrules"
	"kurz.dev/pkg/testkit/metrictest"
	"kurz.dev/pkg/testkit/servertest"
)

// fakeRedis is the part of Redis the resolver uses: GET and SET NX of link
// entries. Any other command panics (the nil embedded interface), so a test
// notices a resolver that starts using one.
type fakeRedis struct {
	redis.Cmdable
	mu      sync.Mutex
	entries map[string]string
	ttls    map[string]time.Duration
	gets    map[string]int
	getErr  error // every GET fails with it
	fillErr error // every SET NX fails with it
	// hold, if set, makes every GET wait for it to be closed; arrived, if
	// set, is sent the key of each GET that starts waiting.
	hold    chan struct{}
	arrived chan string
}

func newFakeRedis() *fakeRedis {
	return &fakeRedis{entries: map[string]string{}, ttls: map[string]time.Duration{}, gets: map[string]int{}}
}

func (f *fakeRedis) Get(ctx context.Context, key string) *redis.StringCmd {
	if f.hold != nil {
		if f.arrived != nil {
			f.arrived <- key
		}
		<-f.hold
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gets[key]++
	cmd := redis.NewStringCmd(ctx, "get", key)
	if f.getErr != nil {
		cmd.SetErr(f.getErr)
	} else if v, ok := f.entries[key]; ok {
		cmd.SetVal(v)
	} else {
		cmd.SetErr(redis.Nil)
	}
	return cmd
}

func (f *fakeRedis) SetNX(ctx context.Context, key string, value any, ttl time.Duration) *redis.BoolCmd {
	f.mu.Lock()
	defer f.mu.Unlock()
	cmd := redis.NewBoolCmd(ctx, "set", key, value, "nx")
	if f.fillErr != nil {
		cmd.SetErr(f.fillErr)
		return cmd
	}
	if _, ok := f.entries[key]; ok {
		return cmd // false: a newer entry wins
	}
	f.entries[key], f.ttls[key] = value.(string), ttl
	cmd.SetVal(true)
	return cmd
}

// EvalSha finds no script: every script runs through Eval.
func (f *fakeRedis) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, "evalsha", sha)
	cmd.SetErr(redis.ErrNoScript)
	return cmd
}

// Eval runs linkcache's fill script (the only one the resolver sends): set
// the entry where there is none, or where the stale value given is still
// there.
func (f *fakeRedis) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	f.mu.Lock()
	defer f.mu.Unlock()
	cmd := redis.NewCmd(ctx, "eval", keys[0])
	if f.fillErr != nil {
		cmd.SetErr(f.fillErr)
		return cmd
	}
	value, ttlMs, stale := args[0].(string), args[1].(int64), args[2].(string)
	if cur, ok := f.entries[keys[0]]; ok && (stale == "" || cur != stale) {
		cmd.SetVal(int64(0)) // a newer entry wins
		return cmd
	}
	f.entries[keys[0]], f.ttls[keys[0]] = value, time.Duration(ttlMs)*time.Millisecond
	cmd.SetVal(int64(1))
	return cmd
}

// entry returns what Redis holds for code, and its TTL.
func (f *fakeRedis) entry(t *testing.T, code string) (linkcache.Entry, time.Duration, bool) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.entries[linkcache.Key(code)]
	if !ok {
		return linkcache.Entry{}, 0, false
	}
	e, err := linkcache.Unmarshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return e, f.ttls[linkcache.Key(code)], true
}

func (f *fakeRedis) getsOf(code string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gets[linkcache.Key(code)]
}

// link is a row of the links table, in the resolver's column order.
type link struct {
	tenant, url           string
	status                int16
	expires               *time.Time
	disabled, deleted     bool
	maxVisits             int64
	hash                  *string
	ios, android, desktop *string
	rules                 []byte
}

// fakeDB answers the resolver's query from a map of links by code.
type fakeDB struct {
	mu      sync.Mutex
	links   map[string]link
	queries map[string]int
	err     error
	// hold, if set, makes every query wait for it to be closed.
	hold chan struct{}
}

func newFakeDB() *fakeDB { return &fakeDB{links: map[string]link{}, queries: map[string]int{}} }

func (d *fakeDB) QueryRow(_ context.Context, _ string, args ...any) pgx.Row {
	if d.hold != nil {
		<-d.hold
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	code := args[0].(string)
	d.queries[code]++
	if d.err != nil {
		return row{err: d.err}
	}
	l, ok := d.links[code]
	if !ok {
		return row{err: pgx.ErrNoRows}
	}
	return row{link: &l}
}

func (d *fakeDB) queriesOf(code string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.queries[code]
}

type row struct {
	link *link
	err  error
}

func (r row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	l := r.link
	*dest[0].(*string), *dest[1].(*string), *dest[2].(*int16) = l.tenant, l.url, l.status
	*dest[3].(**time.Time), *dest[4].(*bool), *dest[5].(*bool) = l.expires, l.disabled, l.deleted
	*dest[6].(*int64), *dest[7].(**string) = l.maxVisits, l.hash
	*dest[8].(**string), *dest[9].(**string), *dest[10].(**string) = l.ios, l.android, l.desktop
	*dest[11].(*[]byte) = l.rules
	return nil
}

var testCache = linkcache.Config{TTL: 24 * time.Hour, NegativeTTL: time.Minute}

func newResolver(t *testing.T, rdb *fakeRedis, db *fakeDB) (*Resolver, *sdkmetric.ManualReader) {
	t.Helper()
	reader, meter := metrictest.New()
	r, err := New(Config{L1TTL: time.Hour, L1Size: 100, Cache: testCache, DBTimeout: time.Second, RedisTimeout: time.Second},
		rdb, db, slog.New(slog.DiscardHandler), meter)
	if err != nil {
		t.Fatal(err)
	}
	return r, reader
}

func resolve(t *testing.T, r *Resolver, code string) Result {
	t.Helper()
	res, err := r.Resolve(context.Background(), code, nil)
	if err != nil {
		t.Fatalf("Resolve(%s): %v", code, err)
	}
	return res
}

// The first request after a flush is answered by PostgreSQL and fills
// Redis, the next by Redis, which fills L1, and the rest by L1 alone.
func TestResolveAsksL1ThenRedisThenPostgres(t *testing.T) {
	rdb, db := newFakeRedis(), newFakeDB()
	db.links["abc"] = link{tenant: "acme", url: "https://example.com/a"}
	r, _ := newResolver(t, rdb, db)
	want := linkcache.Entry{State: linkcache.Active, URL: "https://example.com/a", Tenant: "acme"}

	for i, source := range []Source{SourceDB, SourceCache, SourceL1, SourceL1} {
		if got := resolve(t, r, "abc"); got.Source != source || got.Entry != want {
			t.Fatalf("request %d: %+v from %s, want %+v from %s", i+1, got.Entry, got.Source, want, source)
		}
	}
	if got := db.queriesOf("abc"); got != 1 {
		t.Errorf("PostgreSQL queried %d times, want 1", got)
	}
	if got := rdb.getsOf("abc"); got != 2 {
		t.Errorf("Redis read %d times, want 2 (L1 answers after the second)", got)
	}
	if e, ttl, ok := rdb.entry(t, "abc"); !ok || e != want || ttl != testCache.TTL {
		t.Errorf("Redis holds %+v (ttl %v, present %v), want %+v for %v", e, ttl, ok, want, testCache.TTL)
	}
}

// A code no link has is remembered as missing, in Redis for the negative
// TTL only, so a guessed code costs PostgreSQL one query.
func TestUnknownCodeIsCachedAsMissing(t *testing.T) {
	rdb, db := newFakeRedis(), newFakeDB()
	r, _ := newResolver(t, rdb, db)
	for i, source := range []Source{SourceDB, SourceCache, SourceL1} {
		if got := resolve(t, r, "nope"); got.Source != source || got.Entry.State != linkcache.Missing {
			t.Fatalf("request %d: %+v from %s, want missing from %s", i+1, got.Entry, got.Source, source)
		}
	}
	if got := db.queriesOf("nope"); got != 1 {
		t.Errorf("PostgreSQL queried %d times, want 1", got)
	}
	if e, ttl, ok := rdb.entry(t, "nope"); !ok || e.State != linkcache.Missing || ttl != testCache.NegativeTTL {
		t.Errorf("Redis holds %+v (ttl %v, present %v), want missing for %v", e, ttl, ok, testCache.NegativeTTL)
	}
}

// Every column of a link reaches its entry; disabled and deleted links are
// gone, with their tenant (click events carry it) and nothing else.
func TestRowsBecomeEntries(t *testing.T) {
	expires := time.UnixMilli(1790000000123)
	str := func(s string) *string { return &s }
	tests := []struct {
		name string
		link link
		want linkcache.Entry
	}{
		{"every column", link{tenant: "acme", url: "https://example.com/", status: 301, expires: &expires, maxVisits: 5,
			hash: str("$argon2id$x"), ios: str("https://apps.apple.com/x"), desktop: str("https://example.com/d")},
			linkcache.Entry{State: linkcache.Active, URL: "https://example.com/", Tenant: "acme", Status: 301,
				ExpiresAtMs: 1790000000123, MaxVisits: 5, PasswordHash: "$argon2id$x",
				Targets: &linkcache.Targets{IOS: "https://apps.apple.com/x", Desktop: "https://example.com/d"}}},
		{"empty device targets are none", link{tenant: "acme", url: "https://example.com/", ios: str(""), android: str("")},
			linkcache.Entry{State: linkcache.Active, URL: "https://example.com/", Tenant: "acme"}},
		{"disabled", link{tenant: "acme", url: "https://example.com/", disabled: true, hash: str("h")},
			linkcache.Entry{State: linkcache.Gone, Tenant: "acme"}},
		{"deleted", link{tenant: "acme", url: "https://example.com/", deleted: true, maxVisits: 3},
			linkcache.Entry{State: linkcache.Gone, Tenant: "acme"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db := newFakeDB()
			db.links["c"] = tt.link
			r, _ := newResolver(t, newFakeRedis(), db)
			got := resolve(t, r, "c")
			if got.Source != SourceDB || !entriesEqual(got.Entry, tt.want) {
				t.Errorf("got %+v (targets %+v) from %s, want %+v (targets %+v) from db",
					got.Entry, got.Entry.Targets, got.Source, tt.want, tt.want.Targets)
			}
		})
	}
}

func entriesEqual(a, b linkcache.Entry) bool {
	ta, tb := a.Targets, b.Targets
	a.Targets, b.Targets = nil, nil
	return a == b && (ta == nil) == (tb == nil) && (ta == nil || *ta == *tb)
}

// With Redis down the answer comes from PostgreSQL, nothing is written
// back (Redis may hold a newer entry the resolver could not read), and the
// failed read is counted.
func TestRedisErrorFallsThroughToPostgres(t *testing.T) {
	rdb, db := newFakeRedis(), newFakeDB()
	rdb.getErr = errors.New("connection refused")
	db.links["abc"] = link{tenant: "acme", url: "https://example.com/a"}
	r, reader := newResolver(t, rdb, db)
	for i := range 2 {
		if got := resolve(t, r, "abc"); got.Source != SourceDB || got.Entry.URL != "https://example.com/a" {
			t.Fatalf("request %d: %+v from %s, want the link from db", i+1, got.Entry, got.Source)
		}
	}
	if _, _, ok := rdb.entry(t, "abc"); ok {
		t.Error("Redis was filled after its read failed")
	}
	if got := metrictest.Counter(t, reader, "kurz.redirect.cache.errors", "op", "get"); got != 2 {
		t.Errorf("cache errors op=get: %d, want 2", got)
	}
}

// A failed fill is counted but does not fail the request.
func TestFailedFillStillAnswers(t *testing.T) {
	rdb, db := newFakeRedis(), newFakeDB()
	rdb.fillErr = errors.New("READONLY")
	db.links["abc"] = link{tenant: "acme", url: "https://example.com/a"}
	r, reader := newResolver(t, rdb, db)
	if got := resolve(t, r, "abc"); got.Source != SourceDB || got.Entry.URL != "https://example.com/a" {
		t.Fatalf("%+v from %s, want the link from db", got.Entry, got.Source)
	}
	if got := metrictest.Counter(t, reader, "kurz.redirect.cache.errors", "op", "fill"); got != 1 {
		t.Errorf("cache errors op=fill: %d, want 1", got)
	}
}

func TestPostgresErrorIsReturned(t *testing.T) {
	db := newFakeDB()
	db.err = errors.New("too many connections")
	r, _ := newResolver(t, newFakeRedis(), db)
	_, err := r.Resolve(context.Background(), "abc", nil)
	if err == nil || !strings.Contains(err.Error(), "too many connections") || !strings.Contains(err.Error(), "abc") {
		t.Fatalf("got %v, want the PostgreSQL error, naming the code", err)
	}
}

// A failed PostgreSQL lookup is logged (it was answered 503 with no line
// at all), once for a burst of failures, and a schema older than the
// redirect's query says what to upgrade first.
func TestPostgresErrorIsLogged(t *testing.T) {
	for name, tc := range map[string]struct {
		err  error
		want string
	}{
		"outage":     {errors.New("too many connections"), "postgres lookup failed; answering 503"},
		"old schema": {&pgconn.PgError{Code: "42703", Message: `column "rules" does not exist`}, "upgrade the shortener first"},
	} {
		t.Run(name, func(t *testing.T) {
			db := newFakeDB()
			db.err = tc.err
			var logs servertest.SyncBuffer
			r, err := New(Config{L1TTL: time.Hour, L1Size: 100, Cache: testCache, DBTimeout: time.Second, RedisTimeout: time.Second},
				newFakeRedis(), db, slog.New(slog.NewJSONHandler(&logs, nil)), noop.NewMeterProvider().Meter(""))
			if err != nil {
				t.Fatal(err)
			}
			for i := range 50 {
				if _, err := r.Resolve(context.Background(), fmt.Sprintf("c%d", i), nil); err == nil {
					t.Fatal("a lookup whose PostgreSQL failed answered")
				}
			}
			lines := strings.Count(logs.String(), "postgres lookup failed")
			if lines != 1 || !strings.Contains(logs.String(), tc.want) {
				t.Fatalf("%d lines about 50 failed lookups, want 1 saying %q:\n%s", lines, tc.want, logs.String())
			}
		})
	}
}

// Failed Redis reads fall back to PostgreSQL and are logged once for a
// burst, with how many were left out: under a Redis outage every L1 miss
// fails, thousands a second, and each wrote a line.
func TestRedisErrorsAreLoggedOncePerBurst(t *testing.T) {
	rdb, db := newFakeRedis(), newFakeDB()
	rdb.getErr = errors.New("connection refused")
	var logs servertest.SyncBuffer
	r, err := New(Config{L1TTL: time.Hour, L1Size: 100, Cache: testCache, DBTimeout: time.Second, RedisTimeout: time.Second},
		rdb, db, slog.New(slog.NewJSONHandler(&logs, nil)), noop.NewMeterProvider().Meter(""))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := range 50 {
		code := fmt.Sprintf("c%d", i)
		db.links[code] = link{tenant: "acme", url: "https://example.com/" + code}
		if _, err := r.Resolve(context.Background(), code, nil); err != nil {
			t.Fatalf("%s: %v, want it from PostgreSQL", code, err)
		}
	}
	// One line a second: a loaded machine may take more than one.
	most := int(time.Since(start)/time.Second) + 1
	if lines := strings.Count(logs.String(), "redis read failed"); lines < 1 || lines > most {
		t.Fatalf("%d lines about 50 failed Redis reads, want 1 to %d:\n%s", lines, most, logs.String())
	}
}

// The gate is asked for TierCache on an L1 miss, for TierDB before
// PostgreSQL, and never on an L1 hit; its refusal is the caller's error and
// no lookup past it is made.
func TestGateIsAskedPerTier(t *testing.T) {
	rdb, db := newFakeRedis(), newFakeDB()
	db.links["abc"] = link{tenant: "acme", url: "https://example.com/a"}
	r, _ := newResolver(t, rdb, db)
	var asked []Tier
	gate := func(_ context.Context, tier Tier) error { asked = append(asked, tier); return nil }
	for range 3 { // db, cache, l1
		if _, err := r.Resolve(context.Background(), "abc", gate); err != nil {
			t.Fatal(err)
		}
	}
	if want := []Tier{TierCache, TierDB, TierCache}; !slices.Equal(asked, want) {
		t.Errorf("gate asked %v, want %v", asked, want)
	}

	denied := &Denied{RetryAfter: time.Second}
	for _, tier := range []Tier{TierCache, TierDB} {
		gets, queries := rdb.getsOf("new"), db.queriesOf("new")
		_, err := r.Resolve(context.Background(), "new", func(_ context.Context, at Tier) error {
			if at == tier {
				return denied
			}
			return nil
		})
		if !errors.Is(err, denied) {
			t.Fatalf("denied at tier %d: got %v, want the gate's error", tier, err)
		}
		wantGets := gets
		if tier == TierDB {
			wantGets++
		}
		if rdb.getsOf("new") != wantGets || db.queriesOf("new") != queries {
			t.Errorf("denied at tier %d: %d Redis reads and %d queries after it, want %d and %d",
				tier, rdb.getsOf("new"), db.queriesOf("new"), wantGets, queries)
		}
	}
}

// awaitJoined waits until n requests wait on another's lookup: goroutines
// parked in singleflight's Do (its leader runs the lookup in doCall
// instead, so is not counted).
func awaitJoined(t *testing.T, n int) {
	t.Helper()
	joined := func() int {
		buf := make([]byte, 4<<20)
		buf = buf[:runtime.Stack(buf, true)]
		count := 0
		for g := range strings.SplitSeq(string(buf), "\n\n") {
			if strings.Contains(g, "singleflight.(*Group).Do(") && strings.Contains(g, "sync.(*WaitGroup).Wait(") {
				count++
			}
		}
		return count
	}
	if !servertest.Eventually(10*time.Second, func() bool { return joined() >= n }) {
		t.Fatalf("%d of %d requests joined the lookup", joined(), n)
	}
}

// Concurrent misses on one code make one Redis read and one PostgreSQL
// query, and every request gets the answer.
func TestConcurrentMissesShareOneLookup(t *testing.T) {
	const n = 50
	rdb, db := newFakeRedis(), newFakeDB()
	db.links["viral"] = link{tenant: "acme", url: "https://example.com/v"}
	db.hold = make(chan struct{})
	r, reader := newResolver(t, rdb, db)

	results := make(chan Result, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			res, err := r.Resolve(context.Background(), "viral", nil)
			if err != nil {
				t.Errorf("Resolve: %v", err)
			}
			results <- res
		})
	}
	awaitJoined(t, n-1)
	close(db.hold)
	wg.Wait()
	close(results)
	for res := range results {
		if res.Source != SourceDB || res.Entry.URL != "https://example.com/v" {
			t.Errorf("got %+v from %s, want the link from the one db lookup", res.Entry, res.Source)
		}
	}
	if got := db.queriesOf("viral"); got != 1 {
		t.Errorf("%d PostgreSQL queries, want 1", got)
	}
	if got := rdb.getsOf("viral"); got != 1 {
		t.Errorf("%d Redis reads, want 1", got)
	}
	// singleflight reports the leader's call as shared too once any joined,
	// so the count is n, or n-1 if that ever changes: at least every joiner.
	if got := metrictest.Counter(t, reader, "kurz.redirect.lookups.collapsed"); got < n-1 {
		t.Errorf("collapsed %d, want at least %d", got, n-1)
	}
}

// When the request leading a shared lookup is refused by its gate, the
// requests that joined it look up on their own: one client's denial does
// not spread to another.
func TestALeadersDenialDoesNotSpread(t *testing.T) {
	rdb, db := newFakeRedis(), newFakeDB()
	db.links["abc"] = link{tenant: "acme", url: "https://example.com/a"}
	rdb.hold, rdb.arrived = make(chan struct{}), make(chan string, 8)
	r, _ := newResolver(t, rdb, db)

	// The first request's gate refuses its first PostgreSQL lookup only
	// (Resolve retries a shared lookup that was refused, for its leader
	// too, and asks the gate again).
	var dbAsks atomic.Int64
	leaderDone := make(chan error, 1)
	go func() {
		_, err := r.Resolve(context.Background(), "abc", func(_ context.Context, tier Tier) error {
			if tier == TierDB && dbAsks.Add(1) == 1 {
				return &Denied{RetryAfter: time.Second}
			}
			return nil
		})
		leaderDone <- err
	}()
	// It leads: it waits in its Redis read while a second request joins.
	<-rdb.arrived
	type outcome struct {
		res Result
		err error
	}
	follower := make(chan outcome, 1)
	go func() {
		res, err := r.Resolve(context.Background(), "abc", nil)
		follower <- outcome{res, err}
	}()
	awaitJoined(t, 1)
	close(rdb.hold)

	// Its own lookup, or one the leader retried: db, or cache if the
	// other's fill came first; never the denial.
	got := <-follower
	if got.err != nil || got.res.Entry.URL != "https://example.com/a" || got.res.Source == SourceL1 {
		t.Errorf("follower: %+v from %s, %v; want the link from a lookup after the denied one", got.res.Entry, got.res.Source, got.err)
	}
	<-leaderDone
	if dbAsks.Load() == 0 {
		t.Error("the leader's gate was never asked before PostgreSQL")
	}
}

// An invalidation drops the code from L1, and a lookup that began before it
// does not put its possibly stale answer there.
func TestInvalidateDropsTheCodeFromL1(t *testing.T) {
	rdb, db := newFakeRedis(), newFakeDB()
	db.links["abc"] = link{tenant: "acme", url: "https://example.com/a"}
	r, reader := newResolver(t, rdb, db)
	var invalidated []string
	r.AfterInvalidate = func(code string) { invalidated = append(invalidated, code) }
	resolve(t, r, "abc") // db, fills Redis
	resolve(t, r, "abc") // cache, fills L1
	if got := resolve(t, r, "abc"); got.Source != SourceL1 {
		t.Fatalf("third request from %s, want l1", got.Source)
	}
	r.Invalidate("abc")
	if got := resolve(t, r, "abc"); got.Source != SourceCache {
		t.Errorf("after Invalidate: from %s, want cache (L1 dropped the code)", got.Source)
	}
	if len(invalidated) != 1 || invalidated[0] != "abc" {
		t.Errorf("AfterInvalidate saw %v, want [abc]", invalidated)
	}
	if got := metrictest.Counter(t, reader, "kurz.redirect.l1.invalidations", "kind", "code"); got != 1 {
		t.Errorf("invalidations kind=code: %d, want 1", got)
	}

	// A lookup that read Redis before an invalidation but finished after
	// it answers, yet leaves L1 alone.
	r.Invalidate("abc")
	rdb.hold, rdb.arrived = make(chan struct{}), make(chan string, 1)
	done := make(chan Source, 1)
	go func() {
		res, err := r.Resolve(context.Background(), "abc", nil)
		if err != nil {
			t.Errorf("racing lookup: %v", err)
		}
		done <- res.Source
	}()
	<-rdb.arrived
	r.Invalidate("abc")
	close(rdb.hold)
	if got := <-done; got != SourceCache {
		t.Errorf("racing lookup from %s, want cache", got)
	}
	if got := resolve(t, r, "abc"); got.Source != SourceCache {
		t.Errorf("after the racing lookup: from %s, want cache (its answer kept out of L1)", got.Source)
	}
}

// Purge empties L1 (after a Pub/Sub reconnect, invalidations may have been
// missed).
func TestPurgeEmptiesL1(t *testing.T) {
	rdb, db := newFakeRedis(), newFakeDB()
	db.links["a"] = link{tenant: "acme", url: "https://example.com/a"}
	db.links["b"] = link{tenant: "acme", url: "https://example.com/b"}
	r, reader := newResolver(t, rdb, db)
	for _, code := range []string{"a", "b"} {
		resolve(t, r, code)
		resolve(t, r, code)
		if got := resolve(t, r, code); got.Source != SourceL1 {
			t.Fatalf("%s: third request from %s, want l1", code, got.Source)
		}
	}
	r.Purge()
	for _, code := range []string{"a", "b"} {
		if got := resolve(t, r, code); got.Source != SourceCache {
			t.Errorf("%s after Purge: from %s, want cache", code, got.Source)
		}
	}
	if got := metrictest.Counter(t, reader, "kurz.redirect.l1.invalidations", "kind", "purge"); got != 1 {
		t.Errorf("invalidations kind=purge: %d, want 1", got)
	}
}

// TestRulesFromDBAreCompiled: a link's rules column becomes the entry's
// compiled rules (so the first answer, from PostgreSQL, evaluates them),
// and a column that does not decode fails the lookup instead of serving
// the link without its rules.
func TestRulesFromDBAreCompiled(t *testing.T) {
	rdb, db := newFakeRedis(), newFakeDB()
	db.links["ruled"] = link{tenant: "t", url: "https://example.com/", rules: []byte(`{"r":[{"n":"debug","if":[{"q":{"p":"debug"}}],"u":"https://example.com/debug"}]}`)}
	db.links["broken"] = link{tenant: "t", url: "https://example.com/", rules: []byte(`{"v":[{"n":"a","u":"https://example.com/","w":0}]}`)}
	db.links["plain"] = link{tenant: "t", url: "https://example.com/"}
	r, _ := newResolver(t, rdb, db)
	res, err := r.Resolve(context.Background(), "ruled", nil)
	if err != nil {
		t.Fatal(err)
	}
	req := linkrules.Request{RawQuery: "debug"}
	if u, _, ok := res.Entry.Rules.Match(&req); !ok || u != "https://example.com/debug" {
		t.Fatalf("rules from PostgreSQL matched %q, %v", u, ok)
	}
	if _, err := r.Resolve(context.Background(), "broken", nil); err == nil {
		t.Fatal("a link whose rules do not decode resolved")
	}
	if res, err := r.Resolve(context.Background(), "plain", nil); err != nil || res.Entry.Rules != nil {
		t.Fatalf("plain link: rules %v, err %v", res.Entry.Rules, err)
	}
}

// L1 is bounded by weight as well as entries: large entries (long
// destinations, many rules: what a stranger can make) evict the least
// recently used ones once L1Bytes is reached, one over L1Bytes/64 is not
// kept (nor an older version of it), and a replaced, invalidated or purged
// entry gives its weight back.
func TestL1IsBoundedByWeight(t *testing.T) {
	rdb := newFakeRedis()
	const budget = 64 * 8192 // entries up to 8,192 weight are kept
	_, meter := metrictest.New()
	r, err := New(Config{L1TTL: time.Hour, L1Size: 100_000, L1Bytes: budget, Cache: testCache, DBTimeout: time.Second, RedisTimeout: time.Second},
		rdb, newFakeDB(), slog.New(slog.DiscardHandler), meter)
	if err != nil {
		t.Fatal(err)
	}
	put := func(code string, urlLen int) int64 {
		s := linkcache.Marshal(linkcache.Entry{State: linkcache.Active, Tenant: "t", URL: "https://example.com/" + strings.Repeat("a", urlLen)})
		rdb.mu.Lock()
		rdb.entries[linkcache.Key(code)] = s
		rdb.mu.Unlock()
		return l1Overhead + l1PerByte*int64(len(s))
	}
	var w int64
	for i := range 1000 {
		w = put(fmt.Sprint("big", i), 2000)
		resolve(t, r, fmt.Sprint("big", i))
	}
	if got := r.l1Bytes.Load(); got > budget || got < budget-w {
		t.Errorf("L1 weighs %d after 1,000 entries of %d, want at most %d and within one entry of it", got, w, budget)
	}
	if n := r.l1.Len(); int64(n) != r.l1Bytes.Load()/w {
		t.Errorf("L1 holds %d entries weighing %d, want %d", n, r.l1Bytes.Load(), r.l1Bytes.Load()/w)
	}
	if got := resolve(t, r, "big999"); got.Source != SourceL1 {
		t.Errorf("the last entry read came from %s, want l1", got.Source)
	}
	if got := resolve(t, r, "big0"); got.Source != SourceCache {
		t.Errorf("the first entry read came from %s, want Redis (evicted)", got.Source)
	}

	r.Purge()
	if got := r.l1Bytes.Load(); got != 0 {
		t.Fatalf("L1 weighs %d after a purge, want 0", got)
	}
	e := linkcache.Entry{State: linkcache.Active, Tenant: "t", URL: "https://example.com/one"}
	r.admit("one", e, 100)
	r.admit("one", e, 100) // a second lookup's answer replaces the first
	if got, want := r.l1Bytes.Load(), int64(l1Overhead+l1PerByte*100); got != want {
		t.Errorf("L1 weighs %d holding one entry of %d admitted twice, want %d", got, want, want)
	}
	r.Invalidate("one")
	if got := r.l1Bytes.Load(); got != 0 {
		t.Errorf("L1 weighs %d after the invalidation of its only entry, want 0", got)
	}
	r.admit("one", e, 100)
	r.admit("one", e, budget/64) // grown past what one entry may weigh
	if _, ok := r.l1.Get("one"); ok || r.l1Bytes.Load() != 0 {
		t.Errorf("an entry over L1Bytes/64 is kept (or its lighter version; L1 weighs %d), want neither", r.l1Bytes.Load())
	}
}

// An entry's weight bounds what it takes in memory decoded, whatever its
// rules: 64 conditions of each kind, one value each, and of 32 CIDRs each.
func TestL1WeightBoundsTheHeap(t *testing.T) {
	one := func(c linkrules.Condition) func(int) linkrules.Condition {
		return func(int) linkrules.Condition { return c }
	}
	v := "newsletter"
	for name, cond := range map[string]func(i int) linkrules.Condition{
		"plain": nil,
		"cidr": func(i int) linkrules.Condition {
			return linkrules.Condition{CIDRs: []string{fmt.Sprintf("2001:db8:%x::/48", i)}}
		},
		"country":  one(linkrules.Condition{Countries: []string{"DE"}}),
		"device":   one(linkrules.Condition{Devices: []string{"ios"}}),
		"language": one(linkrules.Condition{Languages: []string{"de-DE"}}),
		"query":    one(linkrules.Condition{Query: &linkrules.Query{Param: "utm_source", Value: &v}}),
		"time":     one(linkrules.Condition{Time: &linkrules.Window{FromMs: 1, UntilMs: 2}}),
		"32 cidrs": func(i int) linkrules.Condition {
			cidrs := make([]string, linkrules.MaxValues)
			for j := range cidrs {
				cidrs[j] = fmt.Sprintf("10.%d.%d.0/24", i, j)
			}
			return linkrules.Condition{CIDRs: cidrs}
		},
	} {
		e := linkcache.Entry{State: linkcache.Active, Tenant: "t", URL: "https://example.com/" + strings.Repeat("a", 40)}
		if cond != nil {
			e.Rules = &linkrules.Set{}
			for r := range 8 {
				rule := linkrules.Rule{Name: fmt.Sprint("r", r), URL: "https://example.com/r"}
				for c := range 8 {
					rule.If = append(rule.If, cond(r*8+c))
				}
				e.Rules.Rules = append(e.Rules.Rules, rule)
			}
			if err := e.Rules.Compile(); err != nil {
				t.Fatal(err)
			}
		}
		raw := linkcache.Marshal(e)
		kept := make([]linkcache.Entry, 500)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range kept {
			var err error
			if kept[i], err = linkcache.Unmarshal(raw); err != nil {
				t.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		heap := int64(after.HeapAlloc-before.HeapAlloc) / int64(len(kept))
		if w := weight(e, len(raw)); w < heap {
			t.Errorf("%s: weight %d of an entry that takes %d bytes decoded (encoding %d)", name, w, heap, len(raw))
		}
		runtime.KeepAlive(kept)
	}
}

// An entry an older build filled (a redirect from before passwords: the
// protected link without its hash) is not served: the link is read from
// PostgreSQL and the entry replaced; a newer build's entry is not served
// either (its fields may ask what this build cannot do), nor replaced.
func TestEntriesOfOtherFormatsAreNotServed(t *testing.T) {
	rdb, db := newFakeRedis(), newFakeDB()
	hash := "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA"
	db.links["pw"] = link{tenant: "acme", url: "https://example.com/secret", hash: &hash}
	db.links["new"] = link{tenant: "acme", url: "https://example.com/new"}
	old := `{"s":"active","u":"https://example.com/secret","t":"acme"}`
	newer := `{"v":99,"s":"active","u":"https://example.com/new","t":"acme","zz":1}`
	rdb.entries[linkcache.Key("pw")], rdb.entries[linkcache.Key("new")] = old, newer
	r, _ := newResolver(t, rdb, db)

	if got := resolve(t, r, "pw"); got.Source != SourceDB || got.Entry.PasswordHash != hash {
		t.Errorf("a link behind an older format's entry: %+v from %s; want it from PostgreSQL, with its password", got.Entry, got.Source)
	}
	if e, _, ok := rdb.entry(t, "pw"); !ok || e.PasswordHash != hash {
		t.Errorf("Redis holds %+v after the lookup; want the older entry replaced, with the password", e)
	}
	if got := resolve(t, r, "new"); got.Source != SourceDB {
		t.Errorf("a link behind a newer format's entry came from %s; want PostgreSQL", got.Source)
	}
	rdb.mu.Lock()
	kept := rdb.entries[linkcache.Key("new")]
	rdb.mu.Unlock()
	if kept != newer {
		t.Errorf("a newer format's entry was replaced with %s", kept)
	}
}
