//go:build integration

package chconn_test

import (
	"testing"

	"kurz.dev/pkg/testkit/stack"
)

func TestMain(m *testing.M) { stack.Require(m, stack.ClickHouse) }
