package pgpool

import (
	"context"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Migrate applies the *.sql files of fsys that component has not applied yet,
// in name order (name them 0001_create_links.sql, 0002_...). Each file runs in
// its own transaction together with its bookkeeping row, so a failed file
// leaves no trace. A session advisory lock per component serialises replicas
// that start together. It returns the names it applied.
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
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, lock); err != nil {
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
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, string(body)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (component, name) VALUES ($1, $2)`, component, name)
			return err
		})
		if err != nil {
			return applied, fmt.Errorf("migrate %s: %s: %w", component, path.Base(name), err)
		}
		applied = append(applied, name)
	}
	return applied, nil
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
