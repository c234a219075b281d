package console_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/server/servertest"
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
// redirect writing clicks into the Redis streams, and analytics moving them
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
	bin := func(name string) string { return filepath.Join(dir, name) }

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

	addrs := make([]string, 10)
	for i := range addrs {
		if addrs[i], err = servertest.FreeAddr(); err != nil {
			return nil, err
		}
	}
	limGRPC, limHTTP, shortGRPC, shortHTTP, anGRPC := addrs[0], addrs[1], addrs[2], addrs[3], addrs[4]
	anHTTP, redGRPC, redHTTP, pgLimGRPC, pgLimHTTP := addrs[5], addrs[6], addrs[7], addrs[8], addrs[9]
	s.redirectURL = "http://" + redHTTP
	common := []string{"KURZ_LOG_LEVEL=warn", "KURZ_REDIS_READ_TIMEOUT=1s", "KURZ_REDIS_WRITE_TIMEOUT=1s"}

	// The admin API sets tenants' plans in the limiter's rule tables: a
	// limiter on PostgreSQL creates them (on a fresh database) and stops.
	p, err := servertest.StartProcess("limiter", bin("limiter"), pgLimGRPC, limiterService, append(common,
		"KURZ_LIMITER_GRPC_ADDR="+pgLimGRPC, "KURZ_LIMITER_HTTP_ADDR="+pgLimHTTP,
		"KURZ_LIMITER_RULES_SOURCE=postgres", "KURZ_LIMITER_RULES_FILE=")...)
	if err != nil {
		return nil, err
	}
	if err := p.Stop(); err != nil {
		return nil, fmt.Errorf("limiter (rule tables): %w\n%s", err, p.Output())
	}

	starts := []struct {
		dst                 **servertest.Process
		name, grpc, service string
		env                 []string
	}{
		{&s.limiter, "limiter", limGRPC, limiterService, []string{
			"KURZ_LIMITER_GRPC_ADDR=" + limGRPC, "KURZ_LIMITER_HTTP_ADDR=" + limHTTP, "KURZ_LIMITER_REDIS_TIMEOUT=1s",
			"KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE=" + rules}},
		{&s.shortener, "shortener", shortGRPC, shortenerService, []string{
			"KURZ_SHORTENER_GRPC_ADDR=" + shortGRPC, "KURZ_SHORTENER_HTTP_ADDR=" + shortHTTP,
			"KURZ_LIMITER_GRPC_ADDR=" + limGRPC, "KURZ_SHORTENER_LIMITER_TIMEOUT=1s",
			"KURZ_SHORTENER_BASE_URL=" + s.redirectURL, "KURZ_SHORTENER_ALLOW_ANONYMOUS=false"}},
		{&s.analytics, "analytics", anGRPC, analyticsService, []string{
			"KURZ_ANALYTICS_GRPC_ADDR=" + anGRPC, "KURZ_ANALYTICS_HTTP_ADDR=" + anHTTP,
			"KURZ_LIMITER_GRPC_ADDR=" + limGRPC, "KURZ_ANALYTICS_LIMITER_TIMEOUT=1s",
			fmt.Sprint("KURZ_CLICK_STREAM_SHARDS=", streamShards), "KURZ_ANALYTICS_CONSUMER_GROUP=" + group,
			"KURZ_ANALYTICS_BATCH_AGE=100ms"}},
		{&s.redirect, "redirect", redGRPC, "", []string{
			"KURZ_REDIRECT_GRPC_ADDR=" + redGRPC, "KURZ_REDIRECT_HTTP_ADDR=" + redHTTP,
			"KURZ_LIMITER_GRPC_ADDR=" + limGRPC, "KURZ_REDIRECT_LIMITER_TIMEOUT=1s",
			"KURZ_REDIRECT_VISITOR_SALT=console-test-salt", fmt.Sprint("KURZ_CLICK_STREAM_SHARDS=", streamShards),
			"KURZ_REDIRECT_CLICK_FLUSH_INTERVAL=20ms"}},
	}
	var wg sync.WaitGroup
	errs := make([]error, len(starts))
	for i, st := range starts {
		wg.Go(func() {
			*st.dst, errs[i] = servertest.StartProcess(st.name, bin(st.name), st.grpc, st.service, append(common, st.env...)...)
		})
	}
	wg.Wait()
	for _, st := range starts {
		if p := *st.dst; p != nil {
			teardown = append(teardown, func() {
				if err := p.Stop(); err != nil {
					fmt.Fprintf(os.Stderr, "%s did not stop cleanly: %v\n%s\n", p.Name, err, p.Output())
				}
			})
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return s, nil
}
