// Package linkschema holds the PostgreSQL schema of links: the links table
// and the link_block sequence. The shortener owns it and applies it at start;
// the redirect service only reads it (its tests apply it too, so they do not
// depend on the shortener having started first).
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
