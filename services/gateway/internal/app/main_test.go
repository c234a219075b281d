//go:build integration

package app

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// gatewayWithAPIRule starts a limiter on the roomy rules with rule (a
// YAML flow mapping) added first to the api domain, and a gateway asking
// it.
func gatewayWithAPIRule(t *testing.T, rule string) *servertest.Running {
	t.Helper()
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	roomy, err := os.ReadFile(stack.roomyFile)
	if err != nil {
		t.Fatal(err)
	}
	withRule := strings.Replace(string(roomy), "  api:\n    rules:\n", "  api:\n    rules:\n      - "+rule+"\n", 1)
	if withRule == string(roomy) {
		t.Fatal("the roomy rules file has no api domain to add a rule to")
	}
	if err := os.WriteFile(rules, []byte(withRule), 0o600); err != nil {
		t.Fatal(err)
	}
	lim := startLimiterWith(t, rules)
	return startGateway(t, map[string]string{"KURZ_LIMITER_GRPC_ADDR": lim.GRPCAddr})
}
