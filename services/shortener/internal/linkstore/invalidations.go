package linkstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The outbox of Redis refreshes (table link_invalidations): Update and Delete
// queue the code they change in the same statement (one row per code);
// Refresh deletes it once the link's current state reached Redis. A row
// names a code only, never a state: whoever refreshes writes the link as it
// is now, so refreshes in any order, repeated or concurrent, leave Redis
// with the latest state.

// Refresh brings code's cache entry up to date: refreshMany of one code,
// write called with its row, not at all without one (a row removed behind
// the service's back: its invalidation is deleted all the same).
func (s *Store) Refresh(ctx context.Context, code string, write func(context.Context, Link) error) error {
	return s.refreshMany(ctx, []string{code}, func(ctx context.Context, links []Link) error {
		if len(links) == 0 {
			return nil
		}
		return write(ctx, links[0])
	})
}

// refreshMany brings the cache entries of codes up to date: in one
// transaction it takes a share lock on their rows of links, hands the rows
// to write (which stores them in Redis; codes without a row are left out,
// and write is not called for none), and once write succeeds deletes the
// codes' queued invalidations. The lock keeps any change of a row (which
// would queue an invalidation) waiting until write is done, so no
// invalidation is deleted whose change write did not see, and no write
// puts back a state a change had replaced. If write fails, nothing is
// deleted and the error is returned. Changes refresh their code this way
// (creates write the row their insert returned: linkcache.WriteCreated).
//
// write runs while the rows are locked: it must be bounded (a Redis timeout).
func (s *Store) refreshMany(ctx context.Context, codes []string, write func(context.Context, []Link) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("refresh %s: begin: %w", codesOf(codes), err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // after Commit: a no-op
	rows, err := tx.Query(ctx, `SELECT `+columns+` FROM links WHERE code = ANY ($1) FOR SHARE`, codes)
	if err != nil {
		return fmt.Errorf("refresh %s: read links: %w", codesOf(codes), err)
	}
	links, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Link, error) { return scan(r) })
	if err != nil {
		return fmt.Errorf("refresh %s: read links: %w", codesOf(codes), err)
	}
	if len(links) > 0 {
		if err := write(ctx, links); err != nil {
			return err
		}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM link_invalidations WHERE code = ANY ($1)`, codes); err != nil {
		return fmt.Errorf("refresh %s: delete invalidations: %w", codesOf(codes), err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("refresh %s: commit: %w", codesOf(codes), err)
	}
	return nil
}

// codesOf names codes in an error: the code, or how many.
func codesOf(codes []string) string {
	if len(codes) == 1 {
		return codes[0]
	}
	return fmt.Sprintf("%d links", len(codes))
}

// DueInvalidations returns up to limit codes whose queued invalidation is due
// for another attempt, oldest first.
func (s *Store) DueInvalidations(ctx context.Context, limit int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.db.Query(ctx, `SELECT code FROM link_invalidations WHERE next_try_at <= now()
		ORDER BY created_at LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("due invalidations: %w", err)
	}
	codes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("due invalidations: %w", err)
	}
	return codes, nil
}

// Postpone records a failed attempt on code's invalidation: the next one is
// due after base, doubled for every earlier failure, at most maxDelay.
func (s *Store) Postpone(ctx context.Context, code string, base, maxDelay time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_, err := s.db.Exec(ctx, `UPDATE link_invalidations SET attempts = attempts + 1,
			next_try_at = now() + make_interval(secs => least($2 * power(2, least(attempts, 30)), $3))
		WHERE code = $1`, code, base.Seconds(), maxDelay.Seconds())
	if err != nil {
		return fmt.Errorf("postpone invalidation of %s: %w", code, err)
	}
	return nil
}

// PendingInvalidations returns how many links have an invalidation queued
// and how long the oldest has waited (0 when none has).
func (s *Store) PendingInvalidations(ctx context.Context) (n int64, oldest time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var secs float64
	err = s.db.QueryRow(ctx, `SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8
		FROM link_invalidations`).Scan(&n, &secs)
	if err != nil {
		return 0, 0, fmt.Errorf("pending invalidations: %w", err)
	}
	return n, time.Duration(secs * float64(time.Second)), nil
}
