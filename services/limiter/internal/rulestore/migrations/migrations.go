// Package migrations holds the limiter's PostgreSQL schema (rules, plans and
// tenant plans), applied in file name order at start by pgpool.Migrate.
package migrations

import "embed"

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS
