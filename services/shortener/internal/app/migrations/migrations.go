// Package migrations holds the shortener's PostgreSQL schema, applied in file
// name order at start by pgpool.Migrate.
package migrations

import "embed"

// FS holds the migration files, named 0001_links.sql and so on.
//
//go:embed *.sql
var FS embed.FS
