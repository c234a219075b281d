//go:build integration

package redisconn_test

import (
	"testing"

	"kurz.dev/pkg/testkit/stack"
)

func TestMain(m *testing.M) { stack.Require(m, stack.Redis) }
