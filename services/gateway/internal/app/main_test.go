//go:build integration

package app

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"kurz.dev/pkg/testkit/servertest"
	stackgate "kurz.dev/pkg/testkit/stack"
	"kurz.dev/services/gateway/gatewaytest"
)

// Health service names the tests wait for, and the test shortener's
// short-link host.
const (
	limiterService   = gatewaytest.LimiterService
	shortenerService = gatewaytest.ShortenerService
	analyticsService = gatewaytest.AnalyticsService
	shortBase        = gatewaytest.ShortBase
)

// stack is what TestMain starts once for every test: the gateway's services
// (gatewaytest.Stack, its file limiter on the roomy rules, for the
// functional tests), and the rules files.
var stack struct {
	*gatewaytest.Stack
	// rulesFile has small limits (for a test's own limiter), roomyFile room
	// for the functional tests (the shared limiter).
	rulesFile, roomyFile string
}

func TestMain(m *testing.M) {
	stackgate.Gate(stackgate.All...)
	code, err := runTests(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway tests:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func runTests(m *testing.M) (_ int, err error) {
	if stack.rulesFile, err = filepath.Abs(filepath.Join("testdata", "rules.yaml")); err != nil {
		return 0, err
	}
	if stack.roomyFile, err = filepath.Abs(filepath.Join("testdata", "roomy.yaml")); err != nil {
		return 0, err
	}
	if stack.Stack, err = gatewaytest.Start(stack.roomyFile); err != nil {
		return 0, err
	}
	defer stack.Close()
	return m.Run(), nil
}

// startLimiter runs one more limiter on the small-limits rules file, for a
// test that counts on them or stops the limiter.
func startLimiter(t *testing.T) *servertest.Process {
	t.Helper()
	return startLimiterWith(t, stack.rulesFile)
}

// startLimiterWith runs one more limiter on the rules file rules.
func startLimiterWith(t *testing.T, rules string) *servertest.Process {
	t.Helper()
	return servertest.Run(t, stack.BinDir, servertest.Spec{Name: "limiter", Service: limiterService, Env: func(g, h string) []string {
		return append(gatewaytest.LimiterEnv(g, h), "KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE="+rules)
	}})
}
