//go:build integration

package pgpool_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/testkit/servertest"
)

func connect(t *testing.T) *pgxpool.Pool {
	t.Helper()
	var cfg pgpool.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	pool, err := pgpool.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("local PostgreSQL (make up): %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func TestMigrateRoundTrip(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	component := fmt.Sprintf("test_%d", time.Now().UnixNano())
	table := component + "_items"
	t.Cleanup(func() {
		_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+table)
		_, _ = pool.Exec(ctx, "DELETE FROM schema_migrations WHERE component = $1", component)
	})
	fsys := fstest.MapFS{
		"0001_create.sql": {Data: []byte("CREATE TABLE " + table + " (id bigint PRIMARY KEY, name text NOT NULL)")},
		"0002_column.sql": {Data: []byte("ALTER TABLE " + table + " ADD COLUMN note text")},
	}

	applied, err := pgpool.Migrate(ctx, pool, component, fsys)
	if err != nil {
		t.Fatalf("first Migrate: %v", err)
	}
	if got := strings.Join(applied, ","); got != "0001_create.sql,0002_column.sql" {
		t.Errorf("first Migrate applied %q, want both files in order", got)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+table+" (id, name, note) VALUES (1, 'a', 'b')"); err != nil {
		t.Fatalf("schema after migration: %v", err)
	}

	again, err := pgpool.Migrate(ctx, pool, component, fsys)
	if err != nil || len(again) != 0 {
		t.Fatalf("second Migrate: applied %v, err %v; want nothing", again, err)
	}

	fsys["0003_more.sql"] = &fstest.MapFile{Data: []byte("ALTER TABLE " + table + " ADD COLUMN extra int")}
	more, err := pgpool.Migrate(ctx, pool, component, fsys)
	if err != nil || strings.Join(more, ",") != "0003_more.sql" {
		t.Fatalf("third Migrate: applied %v, err %v; want only 0003_more.sql", more, err)
	}

	// An older build (without 0003) is refused by name: a newer one
	// migrated the database past what its code knows.
	delete(fsys, "0003_more.sql")
	if old, err := pgpool.Migrate(ctx, pool, component, fsys); err == nil || !strings.Contains(err.Error(), "0003_more.sql") {
		t.Errorf("Migrate of an older build: applied %v, err %v; want it refused, naming 0003_more.sql", old, err)
	}
}

func TestMigrateFailureLeavesNoTrace(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	component := fmt.Sprintf("test_%d", time.Now().UnixNano())
	table := component + "_half"
	t.Cleanup(func() {
		_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+table)
		_, _ = pool.Exec(ctx, "DELETE FROM schema_migrations WHERE component = $1", component)
	})
	// The second statement fails, so the first must be rolled back with it.
	fsys := fstest.MapFS{"0001_bad.sql": {Data: []byte(
		"CREATE TABLE " + table + " (id int); SELECT no_such_function();")}}
	if _, err := pgpool.Migrate(ctx, pool, component, fsys); err == nil {
		t.Fatal("Migrate of a broken file: want an error")
	}
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	var recorded int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM schema_migrations WHERE component = $1", component).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	if exists || recorded != 0 {
		t.Errorf("after a failed migration: table exists=%v, recorded=%d; want neither", exists, recorded)
	}
}

// Services of a fresh database start together: components migrating at
// once all create the shared bookkeeping table, and each gets its
// migrations applied. (Two concurrent CREATE TABLE IF NOT EXISTS of one
// table can fail on pg_type's unique index: the CI run that found it had a
// limiter and a shortener starting on a fresh kurz_test.)
func TestMigrateOfAFreshDatabaseByComponentsAtOnce(t *testing.T) {
	admin := connect(t)
	ctx := context.Background()
	db := fmt.Sprintf("kurz_migrate_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)") })
	cfg := admin.Config().ConnConfig
	url := fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Password, cfg.Host, cfg.Port, db)
	const components = 8
	errs := make(chan error, components)
	start := make(chan struct{})
	for i := range components {
		go func() {
			pool, err := pgpool.New(ctx, pgpool.Config{URL: url, MaxConns: 2, QueryTimeout: 10 * time.Second})
			if err != nil {
				errs <- err
				return
			}
			defer pool.Close()
			<-start
			c := fmt.Sprintf("c%d", i)
			_, err = pgpool.Migrate(ctx, pool, c, fstest.MapFS{"0001.sql": {Data: []byte("CREATE TABLE " + c + " (id int)")}})
			errs <- err
		}()
	}
	close(start)
	for range components {
		if err := <-errs; err != nil {
			t.Errorf("Migrate at once on a fresh database: %v", err)
		}
	}
}

// A migration that must wait for a table lock (a long transaction reads
// the table) lets the table's readers through while it waits, and applies
// once the transaction ends. Waiting without bound, its queued exclusive
// lock stalled every later read: each uncached redirect, for as long as a
// report or pg_dump ran.
func TestMigrationWaitingForALockLetsReadersThrough(t *testing.T) {
	pool, component, table := lockTestTable(t, 200*time.Millisecond)
	ctx := context.Background()
	fsys := fstest.MapFS{"0001_create.sql": {Data: []byte("CREATE TABLE " + table + " (id bigint PRIMARY KEY)")}}
	if _, err := pgpool.Migrate(ctx, pool, component, fsys); err != nil {
		t.Fatal(err)
	}

	long, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Rollback(ctx) }()
	if _, err := long.Exec(ctx, "SELECT count(*) FROM "+table); err != nil {
		t.Fatal(err)
	}
	fsys["0002_column.sql"] = &fstest.MapFile{Data: []byte("ALTER TABLE " + table + " ADD COLUMN note text")}
	done := make(chan error, 1)
	go func() {
		_, err := pgpool.Migrate(ctx, pool, component, fsys)
		done <- err
	}()
	waiting := func() bool {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::regclass", table).Scan(&n)
		return err == nil && n > 0
	}
	if !servertest.Eventually(10*time.Second, waiting) {
		t.Fatal("the migration never waited for the table's lock")
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var n int
	if err := pool.QueryRow(rctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatalf("a read while the migration waits: %v, want it answered", err)
	}
	if err := long.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Migrate after the transaction ended: %v", err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+table+" (id, note) VALUES (1, 'x')"); err != nil {
		t.Errorf("the column 0002 adds: %v", err)
	}
}

// However long a transaction holds the table, no attempt waits for its
// lock longer than four times the first (1 s by default, half the readers'
// statement timeout): every read queued behind an attempt is answered in
// time. The waits grew to 32 times the first, each holding every read of
// the table that long, while a pg_dump ran.
func TestMigrationLockWaitsStayBounded(t *testing.T) {
	pool, component, table := lockTestTable(t, 100*time.Millisecond)
	ctx := context.Background()
	var logs servertest.SyncBuffer
	defer func(l *slog.Logger) { slog.SetDefault(l) }(slog.Default())
	slog.SetDefault(slog.New(slog.NewJSONHandler(&logs, nil)))
	fsys := fstest.MapFS{"0001_create.sql": {Data: []byte("CREATE TABLE " + table + " (id bigint PRIMARY KEY)")}}
	if _, err := pgpool.Migrate(ctx, pool, component, fsys); err != nil {
		t.Fatal(err)
	}
	long, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Rollback(ctx) }()
	if _, err := long.Exec(ctx, "SELECT count(*) FROM "+table); err != nil {
		t.Fatal(err)
	}
	fsys["0002_column.sql"] = &fstest.MapFile{Data: []byte("ALTER TABLE " + table + " ADD COLUMN note text")}
	done := make(chan error, 1)
	go func() {
		_, err := pgpool.Migrate(ctx, pool, component, fsys)
		done <- err
	}()
	waits := func() []time.Duration {
		var out []time.Duration
		for line := range strings.Lines(logs.String()) {
			var rec struct {
				Msg         string        `json:"msg"`
				LockTimeout time.Duration `json:"lock_timeout"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && strings.Contains(rec.Msg, "waited for a table lock") {
				out = append(out, rec.LockTimeout)
			}
		}
		return out
	}
	if !servertest.Eventually(30*time.Second, func() bool { return len(waits()) >= 5 }) {
		t.Fatalf("attempts logged %v, want 5 while the transaction lasts", waits())
	}
	if err := long.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Migrate after the transaction ended: %v", err)
	}
	got := waits()
	for i, w := range got {
		if want := min(100*time.Millisecond<<i, 400*time.Millisecond); w != want {
			t.Errorf("attempt %d waited %v for the lock, want %v (all: %v)", i+1, w, want, got)
		}
	}
}

// Readers that overlap, each longer than the first attempt's lock timeout,
// do not starve a migration: each attempt waits longer than the last. The
// retry's log line names the sessions it waited for.
func TestMigrationIsNotStarvedByOverlappingReaders(t *testing.T) {
	pool, component, table := lockTestTable(t, 100*time.Millisecond)
	ctx := context.Background()
	var logs servertest.SyncBuffer
	defer func(l *slog.Logger) { slog.SetDefault(l) }(slog.Default())
	slog.SetDefault(slog.New(slog.NewJSONHandler(&logs, nil)))
	fsys := fstest.MapFS{"0001_create.sql": {Data: []byte("CREATE TABLE " + table + " (id bigint PRIMARY KEY)")}}
	if _, err := pgpool.Migrate(ctx, pool, component, fsys); err != nil {
		t.Fatal(err)
	}

	// Readers of 300 ms, a new one every 100 ms: never a moment without one.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				wg.Go(func() { _, _ = pool.Exec(ctx, "SELECT count(*), pg_sleep(0.3) FROM "+table) })
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()
	reading := func() bool {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(0.3) FROM "+table+"%' AND state = 'active' AND pid <> pg_backend_pid()").Scan(&n)
		return err == nil && n > 0
	}
	if !servertest.Eventually(10*time.Second, reading) {
		t.Fatal("no reader started")
	}
	mctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	fsys["0002_column.sql"] = &fstest.MapFile{Data: []byte("ALTER TABLE " + table + " ADD COLUMN note text")}
	if _, err := pgpool.Migrate(mctx, pool, component, fsys); err != nil {
		t.Fatalf("Migrate among overlapping readers: %v", err)
	}
	if out := logs.String(); !strings.Contains(out, "waited for a table lock") || !strings.Contains(out, "pg_sleep") {
		t.Errorf("no retry logged naming the reader it waited for:\n%s", out)
	}
}

// lockTestTable is a component of the test's own, its table's name, and
// MigrationLockTimeout set to timeout for the test.
func lockTestTable(t *testing.T, timeout time.Duration) (pool *pgxpool.Pool, component, table string) {
	t.Helper()
	pool = connect(t)
	component = fmt.Sprintf("test_%d", time.Now().UnixNano())
	table = component + "_items"
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table)
		_, _ = pool.Exec(context.Background(), "DELETE FROM schema_migrations WHERE component = $1", component)
	})
	old := pgpool.MigrationLockTimeout
	t.Cleanup(func() { pgpool.MigrationLockTimeout = old })
	pgpool.MigrationLockTimeout = timeout
	return pool, component, table
}

// indexBuild is a component of the test's own with a table, a transaction
// that wrote the table and stays open (open), and files: the table's, then
// a concurrent build of an index on it, named index.
type indexBuild struct {
	pool      *pgxpool.Pool
	component string
	index     string
	files     fstest.MapFS
	open      pgx.Tx
}

func newIndexBuild(t *testing.T) *indexBuild {
	t.Helper()
	ctx := context.Background()
	b := &indexBuild{pool: connect(t), component: fmt.Sprintf("test_%d", time.Now().UnixNano())}
	table := b.component + "_rows"
	b.index = table + "_kind"
	t.Cleanup(func() {
		_, _ = b.pool.Exec(ctx, "DROP TABLE IF EXISTS "+table)
		_, _ = b.pool.Exec(ctx, "DELETE FROM schema_migrations WHERE component = $1", b.component)
	})
	b.files = fstest.MapFS{"0001_create.sql": {Data: []byte("CREATE TABLE " + table + " (id bigint PRIMARY KEY, kind text NOT NULL)")}}
	if _, err := pgpool.Migrate(ctx, b.pool, b.component, b.files); err != nil {
		t.Fatal(err)
	}
	var err error
	if b.open, err = b.pool.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.open.Rollback(ctx) })
	if _, err := b.open.Exec(ctx, "INSERT INTO "+table+" VALUES (1, 'a')"); err != nil {
		t.Fatal(err)
	}
	b.files["0002_index.sql"] = &fstest.MapFile{Data: []byte(pgpool.ConcurrentDirective + "\n-- by kind\n" +
		"CREATE INDEX CONCURRENTLY IF NOT EXISTS " + b.index + " ON " + table + " (kind, id);\n")}
	return b
}

// migrate runs Migrate in the background; its error arrives on the channel.
func (b *indexBuild) migrate() <-chan error {
	done := make(chan error, 1)
	go func() { _, err := pgpool.Migrate(context.Background(), b.pool, b.component, b.files); done <- err }()
	return done
}

// awaitWaiting waits until a session is in what (a LIKE pattern of its
// last query), waiting on a lock if locked.
func (b *indexBuild) awaitWaiting(t *testing.T, what string, locked bool) {
	t.Helper()
	cond := func() (bool, string) {
		var n int
		err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE query LIKE $1 AND query NOT LIKE '%pg_stat_activity%' AND (NOT $2 OR wait_event_type = 'Lock')`, what, locked).Scan(&n)
		return err == nil && n >= 1, fmt.Sprintf("%d sessions in %s, err %v", n, what, err)
	}
	if ok, state := servertest.EventuallyState(10*time.Second, cond); !ok {
		t.Fatalf("nothing waited in %s: %s", what, state)
	}
}

// A file of concurrent index builds: the index is built and valid, the file
// recorded; while the build waits for a transaction that had the table
// open, other writes of the table pass (a build in a transaction would
// queue them behind its SHARE lock).
func TestConcurrentIndexMigrationLetsWritesThrough(t *testing.T) {
	ctx := context.Background()
	b := newIndexBuild(t)
	done := b.migrate()
	b.awaitWaiting(t, "CREATE INDEX CONCURRENTLY%", true)
	// The write may not wait for a lock at all (lock_timeout counts lock
	// waits only, not a loaded machine's slowness): behind a build in a
	// transaction it would queue for the build's SHARE lock.
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '100ms'"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+b.component+"_rows VALUES (2, 'b')")
		return err
	})
	if err != nil {
		t.Fatalf("a write while the index build waits: %v, want it through without waiting for a lock", err)
	}
	if err := b.open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	var valid bool
	if err := b.pool.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)`, b.index).Scan(&valid); err != nil || !valid {
		t.Fatalf("index %s: valid %v, err %v; want built and valid", b.index, valid, err)
	}
	if again, err := pgpool.Migrate(ctx, b.pool, b.component, b.files); err != nil || len(again) != 0 {
		t.Fatalf("second Migrate: applied %v, err %v; want nothing", again, err)
	}
}

// A concurrent build that failed leaves an invalid index, which IF NOT
// EXISTS would keep for good: the next run drops it and builds it again.
// Such a file may hold nothing but index builds.
func TestConcurrentIndexMigrationRebuildsAFailedBuild(t *testing.T) {
	pool := connect(t)
	ctx := context.Background()
	component := fmt.Sprintf("test_%d", time.Now().UnixNano())
	table := component + "_dups"
	t.Cleanup(func() {
		_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+table)
		_, _ = pool.Exec(ctx, "DELETE FROM schema_migrations WHERE component = $1", component)
	})
	fsys := fstest.MapFS{"0001_create.sql": {Data: []byte("CREATE TABLE " + table + " (id bigint, kind text);" +
		"INSERT INTO " + table + " VALUES (1, 'a'), (1, 'b')")}}
	if _, err := pgpool.Migrate(ctx, pool, component, fsys); err != nil {
		t.Fatal(err)
	}
	fsys["0002_unique.sql"] = &fstest.MapFile{Data: []byte(pgpool.ConcurrentDirective + "\n" +
		"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS " + table + "_id ON " + table + " (id)")}
	if _, err := pgpool.Migrate(ctx, pool, component, fsys); err == nil {
		t.Fatal("a unique index over duplicates: want the build to fail")
	}
	var valid bool
	if err := pool.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)`, table+"_id").Scan(&valid); err != nil || valid {
		t.Fatalf("after the failed build: valid %v, err %v; want an invalid index left, as PostgreSQL leaves one", valid, err)
	}
	if _, err := pool.Exec(ctx, "DELETE FROM "+table+" WHERE kind = 'b'"); err != nil {
		t.Fatal(err)
	}
	if applied, err := pgpool.Migrate(ctx, pool, component, fsys); err != nil || strings.Join(applied, ",") != "0002_unique.sql" {
		t.Fatalf("Migrate after the duplicate went: applied %v, err %v", applied, err)
	}
	if err := pool.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)`, table+"_id").Scan(&valid); err != nil || !valid {
		t.Fatalf("rebuilt index: valid %v, err %v; want valid", valid, err)
	}

	// An index build before the refused statement is not built either.
	fsys["0003_other.sql"] = &fstest.MapFile{Data: []byte(pgpool.ConcurrentDirective + "\n" +
		"CREATE INDEX CONCURRENTLY IF NOT EXISTS " + table + "_kind ON " + table + " (kind);\n" +
		"ALTER TABLE " + table + " ADD COLUMN note text")}
	if _, err := pgpool.Migrate(ctx, pool, component, fsys); err == nil || !strings.Contains(err.Error(), "allows only CREATE") {
		t.Fatalf("a concurrent file with an ALTER TABLE: %v, want it refused", err)
	}
	var recorded int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM schema_migrations WHERE component = $1 AND name = '0003_other.sql'", component).Scan(&recorded); err != nil || recorded != 0 {
		t.Fatalf("the refused file recorded %d times, err %v", recorded, err)
	}
	var built bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table+"_kind").Scan(&built); err != nil || built {
		t.Fatalf("the refused file's first index: built %v, err %v; want nothing built", built, err)
	}
}

// Replicas that start together: one builds an index concurrently while the
// other waits for the migration lock. The build waits for every
// transaction with an older snapshot, the waiter's among them if it waited
// inside a statement, which would wait for the builder: a deadlock. Both
// migrate.
func TestConcurrentIndexMigrationWithAReplicaWaiting(t *testing.T) {
	b := newIndexBuild(t)
	first := b.migrate()
	b.awaitWaiting(t, "CREATE INDEX CONCURRENTLY%", true)
	second := b.migrate()
	b.awaitWaiting(t, "%advisory_lock(%", false)
	if err := b.open.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]<-chan error{"first": first, "second": second} {
		select {
		case err := <-ch:
			if err != nil {
				t.Errorf("the %s replica's Migrate: %v", name, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the %s replica's Migrate did not return within 30 s", name)
		}
	}
}
