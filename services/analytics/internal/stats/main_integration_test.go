//go:build integration

package stats

import (
	"testing"

	"kurz.dev/pkg/testkit/stack"
)

func TestMain(m *testing.M) { stack.Require(m, stack.ClickHouse) }
