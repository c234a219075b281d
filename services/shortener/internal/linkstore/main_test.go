//go:build integration

package linkstore

import (
	"testing"

	"kurz.dev/pkg/testkit/stack"
)

// TestMain runs the integration tests, which use the stack's PostgreSQL,
// only when it answers.
func TestMain(m *testing.M) { stack.Require(m, stack.Postgres) }
