//go:build integration

package faults

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/pkg/testkit/stack"
)

// bins holds the five service binaries, built once for every test.
var bins string

// The shared stores (make up; kurz_test databases under make test).
var (
	pgURL    string
	chDB     string
	sharedDB *pgxpool.Pool
)

func TestMain(m *testing.M) {
	stack.Gate(stack.All...)
	code, err := runTests(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fault tests:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func runTests(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "kurz-faults-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	bins = dir
	if err := servertest.BuildServices(dir, "limiter", "shortener", "redirect", "analytics", "gateway"); err != nil {
		return 0, err
	}
	var pg pgpool.Config
	if err := config.Load(&pg); err != nil {
		return 0, err
	}
	pgURL = pg.URL
	chDB = os.Getenv("KURZ_CLICKHOUSE_DATABASE")
	if sharedDB, err = pgpool.New(context.Background(), pg); err != nil {
		return 0, err
	}
	defer sharedDB.Close()
	if err := migrateLimiterRules(dir); err != nil {
		return 0, err
	}
	return m.Run(), nil
}

// Health service names.
const (
	limiterService   = "kurz.ratelimit.v1.RateLimitService"
	shortenerService = "kurz.shortener.v1.ShortenerService"
	analyticsService = "kurz.analytics.v1.AnalyticsService"
)

// service is one service process on its own loopback addresses; it can be
// stopped and started again on the same addresses with the same
// environment, as a pod restarted in place.
type service struct {
	name               string
	grpcAddr, httpAddr string
	// opsAddr serves /readyz and /metrics: its own listener on the public
	// services (gateway, redirect), httpAddr on the others.
	opsAddr string
	env     []string
	*servertest.Process
}

// startService runs the named service with env (on top of the test
// process's environment) on fresh loopback addresses and waits until it is
// SERVING; it is killed when the test ends.
func startService(t *testing.T, name string, env ...string) *service {
	t.Helper()
	s := &service{name: name, grpcAddr: freeAddr(t), httpAddr: freeAddr(t)}
	s.opsAddr = s.httpAddr
	prefix := "KURZ_" + strings.ToUpper(name)
	if name == "gateway" || name == "redirect" {
		s.opsAddr = freeAddr(t)
		env = append([]string{prefix + "_OPS_ADDR=" + s.opsAddr}, env...)
	}
	s.env = append([]string{prefix + "_GRPC_ADDR=" + s.grpcAddr, prefix + "_HTTP_ADDR=" + s.httpAddr, "KURZ_LOG_LEVEL=warn",
		// Socket timeouts roomy enough for race-enabled binaries on two busy
		// cores; the limiter's per-decision deadline (its own setting) is
		// what the faults are measured against.
		"KURZ_REDIS_READ_TIMEOUT=1s", "KURZ_REDIS_WRITE_TIMEOUT=1s",
		// The redirect loads come from one address, thousands a second past
		// L1 while Redis is down: lift the per-IP walk bound (not under test).
		"KURZ_REDIRECT_WALK_RATE=1000000", "KURZ_REDIRECT_WALK_BURST=1000000"}, env...)
	s.start(t)
	return s
}

func (s *service) start(t *testing.T) {
	t.Helper()
	p, err := servertest.StartProcess(s.name, filepath.Join(bins, s.name), s.grpcAddr, "", s.env...)
	if err != nil {
		t.Fatal(err)
	}
	s.Process = p
	t.Cleanup(func() {
		// What the service logged (warnings and errors) is the first thing
		// to read when a fault test fails, in CI most of all.
		if t.Failed() {
			t.Logf("%s logged (last %d bytes at most):\n%s", s.name, maxLogShown, lastBytes(p.Output(), maxLogShown))
		}
	})
	t.Cleanup(p.Kill)
}

// maxLogShown bounds the log a failed test shows of each service.
const maxLogShown = 8 << 10

// lastBytes is the end of s, at most n bytes, from a line's start.
func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// restart stops the service gracefully (SIGTERM) and starts it again.
func (s *service) restart(t *testing.T) {
	t.Helper()
	if err := s.Stop(); err != nil {
		t.Fatalf("%s did not stop cleanly: %v\n%s", s.name, err, s.Output())
	}
	s.start(t)
}

// conn is a gRPC client connection to the service.
func (s *service) conn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	return dial(t, s.grpcAddr)
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	// Signed as the gateway signs: the shortener and analytics refuse
	// unsigned calls.
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), servertest.ServiceAuth())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := servertest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// proxy starts a fault proxy to target, closed when the test ends.
func proxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := NewProxy("127.0.0.1:0", target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// privateCluster starts a Redis Cluster of the test's own, behind proxies.
func privateCluster(t *testing.T) *Cluster {
	t.Helper()
	c, err := StartCluster(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// eventually polls cond until it holds, or fails the test with what and
// the state cond last reported.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if held, state := servertest.EventuallyState(timeout, cond); !held {
		t.Fatalf("%s: not within %v (%s)", what, timeout, state)
	}
}

// testdata returns the absolute path of a file in testdata.
func testdata(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// report logs a fault's outcome in the form `make reliability` collects into
// RELIABILITY.md: the test, the fault, the promise and what was observed.
func report(t *testing.T, fault, promise, observed string) {
	t.Helper()
	t.Logf("RESULT|%s|%s|%s|%s", t.Name(), fault, promise, observed)
}

// migrateLimiterRules runs a limiter once in PostgreSQL mode, so the rule
// tables the gateway's admin API writes tenants' plans to exist in the test
// database (the fault tests' own limiters read their rules from files).
func migrateLimiterRules(bin string) error {
	grpcAddr, err := servertest.FreeAddr()
	if err != nil {
		return err
	}
	httpAddr, err := servertest.FreeAddr()
	if err != nil {
		return err
	}
	p, err := servertest.StartProcess("limiter", filepath.Join(bin, "limiter"), grpcAddr, "",
		"KURZ_LIMITER_GRPC_ADDR="+grpcAddr, "KURZ_LIMITER_HTTP_ADDR="+httpAddr,
		"KURZ_LIMITER_RULES_SOURCE=postgres", "KURZ_LIMITER_RULES_FILE=", "KURZ_LOG_LEVEL=warn",
		"KURZ_REDIS_READ_TIMEOUT=1s", "KURZ_REDIS_WRITE_TIMEOUT=1s")
	if err != nil {
		return err
	}
	if err := p.Stop(); err != nil {
		return fmt.Errorf("limiter (rule tables): %w\n%s", err, p.Output())
	}
	return nil
}
