// Package linkschema holds the shortener's PostgreSQL schema: the links
// table and its link_block sequence, link_invalidations, domains, and the
// webhook subscriptions and deliveries. The shortener owns it and applies it
// at start; the redirect service only reads links and domains (its tests
// apply the schema too, so they do not depend on the shortener having
// started first).
package linkschema

import (
	"context"
	"embed"

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
