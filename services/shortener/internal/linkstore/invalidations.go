package linkstore

import (
	"context"
	"errors"
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

// Refresh brings code's cache entry up to date: in one transaction it takes
// a share lock on code's row of links, hands the row to write (which stores
// it in Redis), and once write succeeds deletes code's queued invalidation.
// The lock keeps any change of the row (which would queue an invalidation)
// waiting until write is done, so no invalidation is deleted whose change
// write did not see. If write fails, nothing is deleted and the error is
// returned. A code without a row (removed behind the service's back) has its
// invalidation deleted and write is not called.
//
// write runs while the row is locked: it must be bounded (a Redis timeout).
func (s *Store) Refresh(ctx context.Context, code string, write func(context.Context, Link) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("refresh %s: begin: %w", code, err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // after Commit: a no-op
	l, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM links WHERE code = $1 FOR SHARE`, code))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return fmt.Errorf("refresh %s: read link: %w", code, err)
	default:
		if err := write(ctx, l); err != nil {
			return err
		}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM link_invalidations WHERE code = $1`, code); err != nil {
		return fmt.Errorf("refresh %s: delete invalidation: %w", code, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("refresh %s: commit: %w", code, err)
	}
	return nil
}

// WriteCreated hands write the current state of links just created
// (codes), read under a share lock held until write returns, as Refresh
// does: a change committed after the insert (UpdateLink, DeleteLink, a
// blocklist sweep) is what write sees, or it waits until write is done and
// then refreshes Redis itself. Writing the state the insert returned could
// put back, after that change's refresh, a state it had replaced: a deleted
// link served for the cache TTL. Codes without a row are left out; write
// runs while the rows are locked and must be bounded (a Redis timeout).
func (s *Store) WriteCreated(ctx context.Context, codes []string, write func(context.Context, []Link) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("write created links: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // after Commit: a no-op
	rows, err := tx.Query(ctx, `SELECT `+columns+` FROM links WHERE code = ANY ($1) FOR SHARE`, codes)
	if err != nil {
		return fmt.Errorf("write created links: read: %w", err)
	}
	links, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Link, error) { return scan(r) })
	if err != nil {
		return fmt.Errorf("write created links: read: %w", err)
	}
	if err := write(ctx, links); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("write created links: commit: %w", err)
	}
	return nil
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
