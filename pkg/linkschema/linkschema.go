// Package linkschema holds the shortener's PostgreSQL schema: the links
// table and its link_block sequence, link_invalidations, domains, and the
// webhook subscriptions and deliveries, and the suspended tenants (which the
// gateway writes). The shortener owns it and applies it at start; the
// redirect service only reads links, domains and tenant_suspensions (its tests
// apply the schema too, so they do not depend on the shortener having
// started first), and may do so as a member of ReaderRole.
package linkschema

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"kurz.dev/pkg/pgpool"
)

// Component is the name the migrations are recorded under in
// schema_migrations.
const Component = "shortener"

// FS holds the migration files, 0001_links.sql and on, applied in name order.
//
//go:embed *.sql
var FS embed.FS

// Apply runs the migrations not applied yet and returns their names.
func Apply(ctx context.Context, db *pgxpool.Pool) ([]string, error) {
	return pgpool.Migrate(ctx, db, Component, FS)
}

// ReaderRole is the PostgreSQL role that may read what the redirect reads,
// links, domains and tenant_suspensions, and nothing else. The redirect faces the internet, so
// its login should hold no more: with the shortener's, it could write any
// table of the database (the gateway's API keys among them). A deployment
// creates the role and the redirect's login in it (deploy/k8s/README.md);
// make up does (deploy/local/infra.sh).
const ReaderRole = "kurz_link_reader"

// GrantReader grants ReaderRole its reads, when the role exists; the
// shortener calls it at every start, after Apply, so a role created after
// the tables gets its grant at the next start. Idempotent.
func GrantReader(ctx context.Context, db *pgxpool.Pool) error {
	_, err := db.Exec(ctx, `DO $$BEGIN
  IF EXISTS (SELECT FROM pg_roles WHERE rolname = '`+ReaderRole+`') THEN
    GRANT SELECT ON links, domains, tenant_suspensions TO `+ReaderRole+`;
  END IF;
END$$`)
	if err != nil {
		return fmt.Errorf("grant %s its reads: %w", ReaderRole, err)
	}
	return nil
}
