//go:build integration

package quotaapi

import (
	"testing"

	"kurz.dev/pkg/testkit/stack"
)

func TestMain(m *testing.M) { stack.Require(m, stack.Redis) }
