//go:build integration

package app

import (
	"testing"

	"kurz.dev/pkg/testkit/stack"
)

// TestMain runs the integration tests, which start shorteners on the
// stack's Redis Cluster and PostgreSQL, only when both answer.
func TestMain(m *testing.M) { stack.Require(m, stack.Redis, stack.Postgres) }
