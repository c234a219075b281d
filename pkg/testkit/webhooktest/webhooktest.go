// Package webhooktest keeps the test stacks that send webhooks apart. Every
// shortener a test starts shares the test database's delivery queue, and a
// shortener that sends claims any due delivery: two sending stacks of
// different test packages (go test runs packages in parallel) would send
// each other's deliveries with their own attempts, backoff and metrics.
// So test shorteners do not send by default (servertest's defaults set
// KURZ_SHORTENER_WEBHOOK_SEND=false), and a package whose stack sends holds
// Lock for as long as it runs.
package webhooktest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/pgpool"
)

// lockKey is the PostgreSQL advisory lock the sending stacks share
// ("kurzwebh" in ASCII).
const lockKey int64 = 0x6b75727a77656268

// Send is the setting that makes a test shortener send.
const Send = "KURZ_SHORTENER_WEBHOOK_SEND=true"

// Lock waits until this process is the one sending stack on the test
// database (KURZ_POSTGRES_URL) and returns what ends that. ctx bounds the
// wait.
func Lock(ctx context.Context) (release func(), err error) {
	var cfg pgpool.Config
	if err := config.Load(&cfg); err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("webhooktest: connect: %w", err)
	}
	// Not one waiting pg_advisory_lock: its snapshot would hold up a
	// concurrent index build of another package's migration, whose
	// process may be the one holding this lock (pgpool.AdvisoryLock).
	if err := pgpool.AdvisoryLock(ctx, conn, lockKey); err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("webhooktest: wait for the sending stacks' lock: %w", err)
	}
	return func() {
		// Closing the session releases its advisory locks.
		_ = conn.Close(context.Background())
	}, nil
}
