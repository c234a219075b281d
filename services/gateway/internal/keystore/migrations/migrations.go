// Package migrations holds the gateway's PostgreSQL schema (tenants and API
// keys), applied at start under the component name "gateway".
package migrations

import "embed"

// Component is the name the migrations are recorded under in
// schema_migrations.
const Component = "gateway"

// FS holds the migration files, applied in name order.
//
//go:embed *.sql
var FS embed.FS
