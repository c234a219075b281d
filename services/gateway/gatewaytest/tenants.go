package gatewaytest

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/netip"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// NewIP returns a client address no other test (or run) uses, so that
// limits per client IP are the test's own: a random host in 2001:db8::/32,
// the documentation prefix.
func NewIP() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[0], b[1], b[2], b[3] = 0x20, 0x01, 0x0d, 0xb8
	return netip.AddrFrom16(b).String()
}

// CleanupTenants deletes what a test wrote for these tenants when it ends:
// their gateway rows (API keys cascade), their plans in the limiter's rule
// tables, their links, their webhook subscriptions (and deliveries) and
// their suspensions.
func CleanupTenants(t testing.TB, db *pgxpool.Pool, ids ...string) {
	t.Cleanup(func() {
		if err := DeleteTenants(context.Background(), db, ids...); err != nil {
			t.Error(err)
		}
	})
}

// DeleteTenants deletes what CleanupTenants does, now.
func DeleteTenants(ctx context.Context, db *pgxpool.Pool, ids ...string) error {
	for _, q := range []string{
		`DELETE FROM gw_tenants WHERE id = ANY($1)`,
		`DELETE FROM rl_tenant_plans WHERE tenant = ANY($1)`,
		`DELETE FROM links WHERE tenant = ANY($1)`,
		`DELETE FROM webhook_subscriptions WHERE tenant = ANY($1)`,
		`DELETE FROM domains WHERE tenant = ANY($1)`,
		`DELETE FROM tenant_suspensions WHERE tenant = ANY($1)`,
	} {
		if _, err := db.Exec(ctx, q, ids); err != nil {
			return fmt.Errorf("clean up (%s): %w", q, err)
		}
	}
	return nil
}
