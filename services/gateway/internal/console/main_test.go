//go:build integration

package console_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/geoip/geoiptest"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/testkit/servertest"
	stackgate "kurz.dev/pkg/testkit/stack"
	"kurz.dev/pkg/testkit/webhooktest"
	"kurz.dev/services/gateway/gatewaytest"
)

// Health service names the stack's processes are awaited on.
const (
	limiterService   = "kurz.ratelimit.v1.RateLimitService"
	shortenerService = "kurz.shortener.v1.ShortenerService"
	analyticsService = "kurz.analytics.v1.AnalyticsService"
)

// streamShards is the click stream layout of the test's redirect and
// analytics: 16 shards, whose keys no other layout in the repository (1, 4
// or the default 8) shares, read by a consumer group of the run's own.
const streamShards = 16

// stack is what the browser test runs against: a limiter on the test's
// rules file, the shortener (its short URLs on the redirect's address), the
// redirect writing clicks (with their countries, from a fixture GeoIP
// database) into the Redis streams, and analytics moving them
// into ClickHouse, all on the shared Redis, PostgreSQL (kurz_test under make
// test) and ClickHouse. It is started by the first test that needs it, and
// stopped by TestMain.
type stack struct {
	limiter, shortener, analytics, redirect *servertest.Process
	// redirectURL is the redirect's base URL (the short URLs' base).
	redirectURL string
	db          *pgxpool.Pool
}

var (
	stackOnce sync.Once
	theStack  *stack
	stackErr  error
	// teardown undoes what the stack's start did, in reverse order.
	teardown []func()
)

func TestMain(m *testing.M) {
	stackgate.Gate(stackgate.All...)
	code := m.Run()
	for i := len(teardown) - 1; i >= 0; i-- {
		teardown[i]()
	}
	os.Exit(code)
}

// startStack starts the stack once for the test binary, or fails t with
// the reason it could not be started.
func startStack(t *testing.T) *stack {
	t.Helper()
	stackOnce.Do(func() { theStack, stackErr = newStack() })
	if stackErr != nil {
		t.Fatalf("starting the services: %v", stackErr)
	}
	return theStack
}

func newStack() (_ *stack, err error) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "kurz-console-test-")
	if err != nil {
		return nil, err
	}
	teardown = append(teardown, func() { os.RemoveAll(dir) })
	rules, err := filepath.Abs(filepath.Join("testdata", "rules.yaml"))
	if err != nil {
		return nil, err
	}
	if err := servertest.BuildServices(dir, "limiter", "shortener", "redirect", "analytics"); err != nil {
		return nil, err
	}
	// The stack's shortener sends webhooks: one such stack at a time.
	lockCtx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	unlock, err := webhooktest.Lock(lockCtx)
	if err != nil {
		return nil, err
	}
	teardown = append(teardown, unlock)

	var pgCfg pgpool.Config
	if err := config.Load(&pgCfg); err != nil {
		return nil, err
	}
	s := &stack{}
	if s.db, err = pgpool.New(ctx, pgCfg); err != nil {
		return nil, err
	}
	teardown = append(teardown, s.db.Close)

	// The consumer group starts at the streams' ends: clicks of earlier runs
	// stay where they are.
	var redisCfg redisconn.Config
	if err := config.Load(&redisCfg); err != nil {
		return nil, err
	}
	rdb, err := redisconn.New(ctx, redisCfg)
	if err != nil {
		return nil, err
	}
	teardown = append(teardown, func() { _ = rdb.Close() })
	group := "console-test-" + rand.Text()[:10]
	for _, key := range clickevent.StreamKeys(streamShards) {
		if err := rdb.XGroupCreateMkStream(ctx, key, group, "$").Err(); err != nil {
			return nil, fmt.Errorf("redis xgroup create %s: %w", key, err)
		}
		teardown = append(teardown, func() { rdb.XGroupDestroy(context.Background(), key, group) })
	}

	limGRPC, err := servertest.FreeAddr()
	if err != nil {
		return nil, err
	}
	redHTTP, err := servertest.FreeAddr()
	if err != nil {
		return nil, err
	}
	s.redirectURL = "http://" + redHTTP
	// The redirect places clicks with a fixture GeoIP database, the client
	// being the X-Forwarded-For of the test (a trusted proxy on loopback).
	geoDB := filepath.Join(dir, "country.mmdb")
	if err := geoiptest.WriteFile(geoDB, geoiptest.Networks); err != nil {
		return nil, err
	}
	common := []string{"KURZ_LOG_LEVEL=warn", "KURZ_REDIS_READ_TIMEOUT=1s", "KURZ_REDIS_WRITE_TIMEOUT=1s"}
	limiter := func(rules ...string) func(g, h string) []string {
		return func(g, h string) []string {
			return append(append(common, "KURZ_LIMITER_GRPC_ADDR="+g, "KURZ_LIMITER_HTTP_ADDR="+h, "KURZ_LIMITER_REDIS_TIMEOUT=1s"), rules...)
		}
	}

	// The admin API sets tenants' plans in the limiter's rule tables: a
	// limiter on PostgreSQL creates them (on a fresh database) and stops.
	procs, err := servertest.StartAll(dir, servertest.Spec{Name: "limiter", Service: limiterService,
		Env: limiter("KURZ_LIMITER_RULES_SOURCE=postgres", "KURZ_LIMITER_RULES_FILE=")})
	if err != nil {
		return nil, err
	}
	if err := procs[0].Stop(); err != nil {
		return nil, fmt.Errorf("limiter (rule tables): %w\n%s", err, procs[0].Output())
	}

	procs, err = servertest.StartAll(dir,
		servertest.Spec{Name: "limiter", Service: limiterService, GRPCAddr: limGRPC,
			Env: limiter("KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE="+rules)},
		servertest.Spec{Name: "shortener", Service: shortenerService, Env: func(g, h string) []string {
			return append(common, "KURZ_SHORTENER_GRPC_ADDR="+g, "KURZ_SHORTENER_HTTP_ADDR="+h,
				"KURZ_LIMITER_GRPC_ADDR="+limGRPC, "KURZ_SHORTENER_LIMITER_TIMEOUT=1s",
				"KURZ_SHORTENER_BASE_URL="+s.redirectURL, "KURZ_SHORTENER_ALLOW_ANONYMOUS=false",
				// The webhook test's receiver is a loopback httptest server.
				webhooktest.Send, "KURZ_SHORTENER_WEBHOOK_ALLOW_HTTP=true", "KURZ_SHORTENER_WEBHOOK_ALLOW_CIDRS=127.0.0.1/32,::1/128",
				"KURZ_SHORTENER_WEBHOOK_POLL_INTERVAL=100ms", "KURZ_SHORTENER_WEBHOOK_BACKOFF_BASE=100ms",
				"KURZ_SHORTENER_WEBHOOK_BACKOFF_MAX=200ms", "KURZ_SHORTENER_WEBHOOK_MAX_ATTEMPTS=2",
				"KURZ_SHORTENER_DNS_SERVER="+gatewaytest.NoDNS, "KURZ_SHORTENER_DNS_TIMEOUT=1s")
		}},
		servertest.Spec{Name: "analytics", Service: analyticsService, Env: func(g, h string) []string {
			return append(common, "KURZ_ANALYTICS_GRPC_ADDR="+g, "KURZ_ANALYTICS_HTTP_ADDR="+h,
				"KURZ_LIMITER_GRPC_ADDR="+limGRPC, "KURZ_ANALYTICS_LIMITER_TIMEOUT=1s",
				fmt.Sprint("KURZ_CLICK_STREAM_SHARDS=", streamShards), "KURZ_ANALYTICS_CONSUMER_GROUP="+group,
				"KURZ_ANALYTICS_BATCH_AGE=100ms")
		}},
		servertest.Spec{Name: "redirect", HTTPAddr: redHTTP, Env: func(g, h string) []string {
			return append(common, "KURZ_REDIRECT_GRPC_ADDR="+g, "KURZ_REDIRECT_HTTP_ADDR="+h, "KURZ_REDIRECT_OPS_ADDR=127.0.0.1:0",
				"KURZ_LIMITER_GRPC_ADDR="+limGRPC, "KURZ_REDIRECT_LIMITER_TIMEOUT=1s",
				"KURZ_REDIRECT_VISITOR_SALT=console-test-salt-0123456789abcdef", fmt.Sprint("KURZ_CLICK_STREAM_SHARDS=", streamShards),
				"KURZ_REDIRECT_CLICK_FLUSH_INTERVAL=20ms", "KURZ_REDIRECT_DOMAIN_REFRESH=200ms", "KURZ_GEOIP_DB="+geoDB, "KURZ_REDIRECT_TRUSTED_PROXIES=127.0.0.1/32,::1")
		}},
	)
	if err != nil {
		return nil, err
	}
	teardown = append(teardown, func() { servertest.StopAll(procs...) })
	s.limiter, s.shortener, s.analytics, s.redirect = procs[0], procs[1], procs[2], procs[3]
	return s, nil
}
