//go:build integration

package rulestore

import (
	"testing"

	"kurz.dev/pkg/testkit/stack"
)

func TestMain(m *testing.M) { stack.Require(m, stack.Postgres) }
