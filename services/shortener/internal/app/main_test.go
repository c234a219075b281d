//go:build integration

package app

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"kurz.dev/pkg/testkit/stack"
	"kurz.dev/pkg/testkit/webhooktest"
)

// TestMain runs the integration tests, which start shorteners on the
// stack's Redis Cluster and PostgreSQL, only when both answer. The webhook
// tests' shorteners send: the package holds webhooktest's lock while it
// runs.
func TestMain(m *testing.M) {
	stack.Gate(stack.Redis, stack.Postgres)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	unlock, err := webhooktest.Lock(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	unlock()
	os.Exit(code)
}
