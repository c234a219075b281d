package pgpool

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// MigrationLockTimeout bounds how long the first attempt at a migration
// waits for a table lock (lock_timeout). A statement such as ALTER TABLE
// queues for an exclusive lock behind every open transaction on its table,
// and every later read of the table queues behind it: waiting without
// bound, one long transaction (a report, pg_dump) stalled every uncached
// redirect for as long as it ran. An attempt that times out rolls back,
// lets the readers through, and is tried again after a pause, each attempt
// waiting twice as long as the one before, so that readers that overlap
// (each shorter than the longest wait) cannot starve it, up to
// maxLockWaits times this: 1 s, half the readers' own statement timeout
// (KURZ_POSTGRES_QUERY_TIMEOUT, 2 s), so that no reader queued behind an
// attempt times out. Waits that grew to 32 s held every read of links
// that long, again and again, while a pg_dump ran. A transaction longer
// than that keeps the migration waiting: the log names it.
var MigrationLockTimeout = 250 * time.Millisecond

// maxLockWaits bounds an attempt's lock_timeout, in MigrationLockTimeouts.
const maxLockWaits = 4

// migrationRetryPause is the pause between attempts.
var migrationRetryPause = time.Second

// Migrate applies the *.sql files of fsys that component has not applied yet,
// in name order (name them 0001_create_links.sql, 0002_...). Each file runs in
// its own transaction together with its bookkeeping row, so a failed file
// leaves no trace; one that waits on a lock longer than MigrationLockTimeout
// is tried again (logged with the sessions it waited for). A file whose
// first line is ConcurrentDirective builds indexes without a transaction
// instead (applyConcurrent). A session advisory lock per component
// serialises replicas that start together. A database with migrations of
// component that fsys lacks (applied by a newer build) is refused. It
// returns the names it applied.
func Migrate(ctx context.Context, pool *pgxpool.Pool, component string, fsys fs.FS) ([]string, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("migrations of %s: %w", component, err)
	}
	slices.Sort(names)

	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate %s: %w", component, err)
	}
	defer conn.Release()
	lock := lockID(component)
	if err := AdvisoryLock(ctx, conn, lock); err != nil {
		return nil, fmt.Errorf("migrate %s: lock: %w", component, err)
	}
	defer func() {
		// A fresh context: the unlock must run even if ctx was cancelled.
		_, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, lock)
	}()

	if err := bookkeeping(ctx, conn); err != nil {
		return nil, fmt.Errorf("migrate %s: bookkeeping table: %w", component, err)
	}
	rows, err := conn.Query(ctx, `SELECT name FROM schema_migrations WHERE component = $1`, component)
	if err != nil {
		return nil, fmt.Errorf("migrate %s: %w", component, err)
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("migrate %s: %w", component, err)
	}
	// A newer build applied migrations this one does not know (a rollback,
	// or an old replica restarting mid-rollout): its code may no longer fit
	// the schema (a changed key, a trigger it does not expect). It stops
	// here, by name, instead of starting and failing request by request.
	var newer []string
	for _, name := range done {
		if !slices.Contains(names, name) {
			newer = append(newer, name)
		}
	}
	if len(newer) > 0 {
		slices.Sort(newer)
		return nil, fmt.Errorf("migrate %s: the database has migrations this build does not have (%s): a newer version applied them; run that version or a later one (docs/operations.md, Upgrades)",
			component, strings.Join(newer, ", "))
	}

	var applied []string
	for _, name := range names {
		if slices.Contains(done, name) {
			continue
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return applied, fmt.Errorf("migrate %s: %w", component, err)
		}
		if strings.TrimSpace(string(body)) == "" {
			return applied, fmt.Errorf("migrate %s: %s is empty", component, name)
		}
		apply := applyOne
		if isConcurrent(string(body)) {
			apply = applyConcurrent
		}
		if err := apply(ctx, pool, conn, component, name, string(body)); err != nil {
			return applied, fmt.Errorf("migrate %s: %s: %w", component, path.Base(name), err)
		}
		applied = append(applied, name)
	}
	return applied, nil
}

// AdvisoryLock takes the session advisory lock id on conn, asking again
// until it is free rather than waiting inside one pg_advisory_lock
// statement: a statement that waits holds a snapshot, and a concurrent
// index build (CREATE INDEX CONCURRENTLY) of the session holding the lock
// waits for every older snapshot to go, so the two would wait for each
// other (PostgreSQL ends that as a deadlock, failing one of them, or, when
// the lock is held by another session the build does not wait for, not at
// all).
func AdvisoryLock(ctx context.Context, conn interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, id int64) error {
	pause := 50 * time.Millisecond
	for {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, id).Scan(&ok); err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause): // another replica migrates: ask again
		}
		pause = min(2*pause, time.Second)
	}
}

// lockNotAvailable is the SQLSTATE of a lock_timeout.
const lockNotAvailable = "55P03"

// applyOne runs one migration and its bookkeeping row in a transaction,
// again after a pause, with a longer lock timeout, whenever it waited on a
// lock past the one it had.
func applyOne(ctx context.Context, pool *pgxpool.Pool, conn *pgxpool.Conn, component, name, body string) error {
	wait := MigrationLockTimeout
	for attempt := 1; ; attempt++ {
		// Who holds the lock is asked while the attempt still waits for it
		// (after it, nobody waits and pg_blocking_pids says nothing).
		var holders []string
		asked := make(chan struct{})
		peek := time.AfterFunc(wait/2, func() {
			defer close(asked)
			holders = lockHolders(ctx, pool, conn.Conn().PgConn().PID())
		})
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, wait.Milliseconds())); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, body); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (component, name) VALUES ($1, $2)`, component, name)
			return err
		})
		if peek.Stop() {
			close(asked)
		}
		<-asked
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != lockNotAvailable {
			return err
		}
		slog.Default().WarnContext(ctx, "migration waited for a table lock; trying again after a pause (a long transaction holds the table)",
			"component", component, "migration", path.Base(name), "attempt", attempt, "retry_in", migrationRetryPause,
			"lock_timeout", wait, "holders", holders)
		select {
		case <-ctx.Done():
			return fmt.Errorf("waited for a table lock %d times (last lock_timeout %v): %w", attempt, wait, ctx.Err())
		case <-time.After(migrationRetryPause):
		}
		wait = min(2*wait, maxLockWaits*MigrationLockTimeout)
	}
}

// ConcurrentDirective, as a migration file's first line, marks a file of
// CREATE INDEX CONCURRENTLY statements: an index built in a transaction
// holds its table's SHARE lock, which blocks every write of the table, for
// as long as the build takes (seconds per million rows), and builds on a
// table that writers of links depend on (webhook_deliveries: the links
// trigger inserts there) would fail those writes meanwhile.
const ConcurrentDirective = "-- kurz:concurrently"

// concurrentIndex is the only statement a ConcurrentDirective file may
// hold: outside a transaction, anything else that fails half-way would
// leave a half-applied migration behind.
var concurrentIndex = regexp.MustCompile(`(?is)^CREATE\s+(UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+([a-z_][a-z0-9_]*)\s+ON\s`)

func isConcurrent(body string) bool {
	first, _, _ := strings.Cut(body, "\n")
	return strings.TrimSpace(first) == ConcurrentDirective
}

// applyConcurrent builds a ConcurrentDirective file's indexes one
// statement at a time, outside a transaction, then records the file. A
// concurrent build takes a lock that writes and reads pass (SHARE UPDATE
// EXCLUSIVE) and waits, without holding anyone up, for the transactions
// that had the table open to end. A build that failed or was cut short
// (the process killed mid-build) leaves an invalid index of its name,
// which IF NOT EXISTS would keep for good: it is dropped first and built
// again. Every index already valid is left alone, so a file interrupted
// part-way resumes where it stopped.
func applyConcurrent(ctx context.Context, _ *pgxpool.Pool, conn *pgxpool.Conn, component, name, body string) error {
	var stmts []string
	for _, stmt := range strings.Split(body, ";") {
		var lines []string
		for _, line := range strings.Split(stmt, "\n") {
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "--") {
				lines = append(lines, line)
			}
		}
		if stmt = strings.TrimSpace(strings.Join(lines, "\n")); stmt != "" {
			stmts = append(stmts, stmt)
		}
	}
	if len(stmts) == 0 {
		return errors.New("no statement after " + ConcurrentDirective)
	}
	// Every statement is checked before any runs: a file refused half-way
	// would leave its first indexes built and itself unrecorded.
	indexes := make([]string, len(stmts))
	for i, stmt := range stmts {
		m := concurrentIndex.FindStringSubmatch(stmt)
		if m == nil {
			return fmt.Errorf("%s allows only CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS <name> ON ...: %.60q", ConcurrentDirective, stmt)
		}
		indexes[i] = m[2]
	}
	for i, stmt := range stmts {
		index := indexes[i]
		var invalid bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass($1) AND NOT indisvalid)`, index).Scan(&invalid); err != nil {
			return fmt.Errorf("index %s: %w", index, err)
		}
		if invalid {
			slog.Default().WarnContext(ctx, "dropping an index an earlier build left unfinished, to build it again",
				"component", component, "migration", path.Base(name), "index", index)
			if _, err := conn.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+pgx.Identifier{index}.Sanitize()); err != nil {
				return fmt.Errorf("drop unfinished index %s: %w", index, err)
			}
		}
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("index %s: %w", index, err)
		}
	}
	_, err := conn.Exec(ctx, `INSERT INTO schema_migrations (component, name) VALUES ($1, $2)`, component, name)
	return err
}

// lockHolders describes the sessions the session pid waits for: what an
// operator looks at when a migration cannot get its lock (best effort).
func lockHolders(ctx context.Context, pool *pgxpool.Pool, pid uint32) []string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	rows, err := pool.Query(ctx, `SELECT format('pid %s (%s, %s since %s): %s', pid, usename, state,
			date_trunc('second', xact_start), left(query, 80))
		FROM pg_stat_activity WHERE pid = ANY(pg_blocking_pids($1))`, int64(pid))
	if err != nil {
		return nil
	}
	holders, _ := pgx.CollectRows(rows, pgx.RowTo[string])
	return holders
}

func lockID(component string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("kurz-migrate:" + component))
	return int64(h.Sum64())
}

// bookkeeping creates schema_migrations if it is missing. Every component
// shares it, and two concurrent CREATE TABLE IF NOT EXISTS of one table can
// both try to create it (one then fails on pg_type's unique index: seen
// when services of a fresh database start together), so the creation takes
// a lock of its own, whatever the component.
func bookkeeping(ctx context.Context, conn *pgxpool.Conn) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockID("schema_migrations")); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		component  text NOT NULL,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (component, name))`); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
