// Package gatewaytest starts the services a gateway talks to, as processes
// built from this repository, for the tests of the gateway and of kurzctl.
package gatewaytest

import (
	"context"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/pkg/testkit/webhooktest"
)

// Health service names the stack's processes are awaited on.
const (
	LimiterService   = "kurz.ratelimit.v1.RateLimitService"
	ShortenerService = "kurz.shortener.v1.ShortenerService"
	AnalyticsService = "kurz.analytics.v1.AnalyticsService"
)

// CodeKey is the test shortener's KURZ_SHORTENER_CODE_KEY (servertest's,
// which every test-started shortener gets): a test reads a block code's ID
// back with linkcode.NewPermutation([]byte(CodeKey)).
const CodeKey = servertest.CodeKey

// ShortBase is the test shortener's short-link host: make up's, so that
// the README's outputs read the same in tests and on a laptop.
const ShortBase = "http://127.0.0.1:8787"

// NoDNS is the test shortener's DNS server: the discard port on loopback,
// where nothing listens, so VerifyDomain fails (503) rather than ask the
// outside world; tests verify domains through the admin API.
const NoDNS = "127.0.0.1:9"

// Stack is two limiters (one on a rules file; one on the rules in
// PostgreSQL, as under make up, where tenant plans apply), the shortener
// (on the file limiter) and analytics, on the shared Redis, PostgreSQL
// (kurz_test under make test) and ClickHouse.
type Stack struct {
	// BinDir holds the services' binaries, for tests that start more.
	BinDir    string
	Limiter   *servertest.Process
	LimiterPG *servertest.Process
	Shortener *servertest.Process
	Analytics *servertest.Process
	// DB is the PostgreSQL the services use, for setup and clean-up.
	DB *pgxpool.Pool
	// unlock lets another package's sending stack run (webhooktest).
	unlock func()
}

// Start builds the services and starts the stack, the file limiter on
// rulesFile (an absolute path). Close undoes it.
func Start(rulesFile string) (_ *Stack, err error) {
	dir, err := os.MkdirTemp("", "kurz-gateway-stack-")
	if err != nil {
		return nil, err
	}
	s := &Stack{BinDir: dir}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	// The stack's shortener sends webhooks: one such stack at a time.
	lockCtx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if s.unlock, err = webhooktest.Lock(lockCtx); err != nil {
		return nil, err
	}
	if err := servertest.BuildServices(dir, "limiter", "shortener", "analytics"); err != nil {
		return nil, err
	}
	var pgCfg pgpool.Config
	if err := config.Load(&pgCfg); err != nil {
		return nil, err
	}
	if s.DB, err = pgpool.New(context.Background(), pgCfg); err != nil {
		return nil, err
	}
	limiterAddr, err := servertest.FreeAddr()
	if err != nil {
		return nil, err
	}
	procs, err := servertest.StartAll(dir,
		servertest.Spec{Name: "limiter", Service: LimiterService, GRPCAddr: limiterAddr, Env: func(g, h string) []string {
			return append(LimiterEnv(g, h), "KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE="+rulesFile)
		}},
		servertest.Spec{Name: "limiter", Service: LimiterService, Env: func(g, h string) []string {
			// Refreshed only by NOTIFY within a test's time.
			return append(LimiterEnv(g, h), "KURZ_LIMITER_RULES_SOURCE=postgres", "KURZ_LIMITER_RULES_REFRESH=1h", "KURZ_LIMITER_RULES_FILE=")
		}},
		servertest.Spec{Name: "shortener", Service: ShortenerService, Env: func(g, h string) []string {
			return []string{"KURZ_SHORTENER_GRPC_ADDR=" + g, "KURZ_SHORTENER_HTTP_ADDR=" + h,
				"KURZ_LIMITER_GRPC_ADDR=" + limiterAddr, "KURZ_SHORTENER_LIMITER_TIMEOUT=1s",
				"KURZ_SHORTENER_BASE_URL=" + ShortBase, "KURZ_SHORTENER_ALLOW_ANONYMOUS=false", "KURZ_LOG_LEVEL=warn",
				// Webhook receivers in tests are loopback httptest servers.
				webhooktest.Send, "KURZ_SHORTENER_WEBHOOK_ALLOW_HTTP=true", "KURZ_SHORTENER_WEBHOOK_ALLOW_CIDRS=127.0.0.1/32,::1/128",
				"KURZ_SHORTENER_WEBHOOK_POLL_INTERVAL=100ms", "KURZ_SHORTENER_WEBHOOK_BACKOFF_BASE=100ms",
				"KURZ_SHORTENER_WEBHOOK_BACKOFF_MAX=200ms", "KURZ_SHORTENER_WEBHOOK_MAX_ATTEMPTS=2",
				// No test asks the outside world's DNS: a TXT lookup goes
				// to a port nothing listens on and fails at once.
				"KURZ_SHORTENER_DNS_SERVER=" + NoDNS, "KURZ_SHORTENER_DNS_TIMEOUT=1s"}
		}},
		servertest.Spec{Name: "analytics", Service: AnalyticsService, Env: func(g, h string) []string {
			return []string{"KURZ_ANALYTICS_GRPC_ADDR=" + g, "KURZ_ANALYTICS_HTTP_ADDR=" + h, "KURZ_LOG_LEVEL=warn"}
		}},
	)
	if err != nil {
		return nil, err
	}
	s.Limiter, s.LimiterPG, s.Shortener, s.Analytics = procs[0], procs[1], procs[2], procs[3]
	return s, nil
}

// Close stops the processes, closes the pool and removes the binaries.
func (s *Stack) Close() {
	servertest.StopAll(s.Limiter, s.LimiterPG, s.Shortener, s.Analytics)
	if s.DB != nil {
		s.DB.Close()
	}
	os.RemoveAll(s.BinDir)
	if s.unlock != nil {
		s.unlock()
	}
}

// LimiterEnv is a limiter's environment: its addresses, and timeouts
// generous enough that the race detector never pushes a decision into a
// rule's failure mode.
func LimiterEnv(grpcAddr, httpAddr string) []string {
	return []string{
		"KURZ_LIMITER_GRPC_ADDR=" + grpcAddr, "KURZ_LIMITER_HTTP_ADDR=" + httpAddr,
		"KURZ_LIMITER_REDIS_TIMEOUT=1s", "KURZ_REDIS_READ_TIMEOUT=1s", "KURZ_REDIS_WRITE_TIMEOUT=1s",
		"KURZ_LOG_LEVEL=warn",
	}
}

// GatewayEnv is the environment of a test's in-process gateway in front of
// the given limiter, shortener and analytics (gRPC addresses), with the
// admin API on adminToken. Callers add or override what their tests need.
func GatewayEnv(limiter, shortener, analytics, adminToken string) map[string]string {
	return map[string]string{
		"KURZ_GATEWAY_GRPC_ADDR":   "127.0.0.1:0",
		"KURZ_GATEWAY_HTTP_ADDR":   "127.0.0.1:0",
		"KURZ_GATEWAY_OPS_ADDR":    "127.0.0.1:0",
		"KURZ_LIMITER_GRPC_ADDR":   limiter,
		"KURZ_SHORTENER_GRPC_ADDR": shortener,
		"KURZ_ANALYTICS_GRPC_ADDR": analytics,
		"KURZ_GATEWAY_ADMIN_TOKEN": adminToken,
		// Generous, so that under the race detector on a loaded machine no
		// call slips into the limiter's fail-open path by accident (tests
		// that want it stop the limiter), and no API-key lookup passes the
		// 2 s default (40 concurrent first requests of one client once did
		// in CI).
		"KURZ_GATEWAY_LIMITER_TIMEOUT": "1s",
		"KURZ_POSTGRES_QUERY_TIMEOUT":  "10s",
	}
}
