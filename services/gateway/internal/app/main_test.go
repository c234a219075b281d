package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/server/servertest"
)

// Health service names the tests wait for.
const (
	limiterService   = "kurz.ratelimit.v1.RateLimitService"
	shortenerService = "kurz.shortener.v1.ShortenerService"
	analyticsService = "kurz.analytics.v1.AnalyticsService"
)

// shortBase is the short-link host of the test shortener: the one make up
// uses, so the README's outputs read the same here and there.
const shortBase = "http://127.0.0.1:8787"

// stack is what TestMain starts once for every test: two limiters (the roomy
// test rules; and the rules in PostgreSQL, which the admin API's plan
// changes reach), the shortener (on the file limiter) and analytics, all on
// the shared Redis, PostgreSQL (kurz_test under make test) and ClickHouse.
var stack struct {
	binDir string
	// rulesFile has small limits (for a test's own limiter), roomyFile room
	// for the functional tests (the shared limiter).
	rulesFile, roomyFile string
	limiter              *servertest.Process
	limiterPG            *servertest.Process
	shortener            *servertest.Process
	analytics            *servertest.Process
	db                   *pgxpool.Pool
}

func TestMain(m *testing.M) {
	code, err := runTests(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway tests:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func runTests(m *testing.M) (_ int, err error) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "kurz-gateway-test-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	stack.binDir = dir
	if stack.rulesFile, err = filepath.Abs(filepath.Join("testdata", "rules.yaml")); err != nil {
		return 0, err
	}
	if stack.roomyFile, err = filepath.Abs(filepath.Join("testdata", "roomy.yaml")); err != nil {
		return 0, err
	}
	if err := servertest.BuildServices(dir, "limiter", "shortener", "analytics"); err != nil {
		return 0, err
	}

	var pgCfg pgpool.Config
	if err := config.Load(&pgCfg); err != nil {
		return 0, err
	}
	if stack.db, err = pgpool.New(ctx, pgCfg); err != nil {
		return 0, err
	}
	defer stack.db.Close()

	limiterAddr, err := servertest.FreeAddr()
	if err != nil {
		return 0, err
	}
	starts := []struct {
		dst     **servertest.Process
		name    string
		service string
		env     func(grpc, http string) []string
	}{
		{&stack.limiter, "limiter", limiterService, func(g, h string) []string {
			return append(limiterEnv(g, h), "KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE="+stack.roomyFile)
		}},
		{&stack.limiterPG, "limiter", limiterService, func(g, h string) []string {
			// Refreshed only by NOTIFY within a test's time.
			return append(limiterEnv(g, h), "KURZ_LIMITER_RULES_SOURCE=postgres", "KURZ_LIMITER_RULES_REFRESH=1h", "KURZ_LIMITER_RULES_FILE=")
		}},
		{&stack.shortener, "shortener", shortenerService, func(g, h string) []string {
			return []string{"KURZ_SHORTENER_GRPC_ADDR=" + g, "KURZ_SHORTENER_HTTP_ADDR=" + h,
				"KURZ_LIMITER_GRPC_ADDR=" + limiterAddr, "KURZ_SHORTENER_LIMITER_TIMEOUT=1s",
				"KURZ_SHORTENER_BASE_URL=" + shortBase, "KURZ_SHORTENER_ALLOW_ANONYMOUS=false", "KURZ_LOG_LEVEL=warn"}
		}},
		{&stack.analytics, "analytics", analyticsService, func(g, h string) []string {
			return []string{"KURZ_ANALYTICS_GRPC_ADDR=" + g, "KURZ_ANALYTICS_HTTP_ADDR=" + h, "KURZ_LOG_LEVEL=warn"}
		}},
	}
	var wg sync.WaitGroup
	errs := make([]error, len(starts))
	for i, s := range starts {
		grpcAddr, httpAddr := limiterAddr, ""
		if i > 0 {
			grpcAddr, err = servertest.FreeAddr()
			if err != nil {
				return 0, err
			}
		}
		if httpAddr, err = servertest.FreeAddr(); err != nil {
			return 0, err
		}
		wg.Go(func() {
			*s.dst, errs[i] = servertest.StartProcess(s.name, filepath.Join(dir, s.name), grpcAddr, s.service, s.env(grpcAddr, httpAddr)...)
		})
	}
	wg.Wait()
	defer func() {
		for _, p := range []*servertest.Process{stack.analytics, stack.shortener, stack.limiterPG, stack.limiter} {
			if p == nil {
				continue
			}
			if serr := p.Stop(); serr != nil {
				fmt.Fprintf(os.Stderr, "%s did not stop cleanly: %v\n%s\n", p.Name, serr, p.Output())
			}
		}
	}()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return m.Run(), nil
}

// limiterEnv is a limiter's environment: its addresses, and timeouts
// generous enough that the race detector never pushes a decision into a
// rule's failure mode.
func limiterEnv(grpcAddr, httpAddr string) []string {
	return []string{
		"KURZ_LIMITER_GRPC_ADDR=" + grpcAddr, "KURZ_LIMITER_HTTP_ADDR=" + httpAddr,
		"KURZ_LIMITER_REDIS_TIMEOUT=1s", "KURZ_REDIS_READ_TIMEOUT=1s", "KURZ_REDIS_WRITE_TIMEOUT=1s",
		"KURZ_LOG_LEVEL=warn",
	}
}

// startLimiter runs one more limiter on the small-limits rules file, for a
// test that counts on them or stops the limiter.
func startLimiter(t *testing.T) *servertest.Process {
	t.Helper()
	grpcAddr, err := servertest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	httpAddr, err := servertest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	p, err := servertest.StartProcess("limiter", filepath.Join(stack.binDir, "limiter"), grpcAddr, limiterService,
		append(limiterEnv(grpcAddr, httpAddr), "KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE="+stack.rulesFile)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}
