//go:build integration

package app

import (
	"bufio"
	"context"
	"crypto/rand"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/servertest"
)

// testCodeKey is the tests' KURZ_SHORTENER_CODE_KEY, which servertest gives
// every shortener a test starts.
const testCodeKey = servertest.CodeKey

// testCodes is the permutation testCodeKey keys: tests read a code's ID back
// with it.
var testCodes = func() *linkcode.Permutation {
	p, err := linkcode.NewPermutation([]byte(testCodeKey))
	if err != nil {
		panic(err)
	}
	return p
}()

// instance is one in-process shortener with a client and handles on its
// stores.
type instance struct {
	*servertest.Running
	api shortenerv1.ShortenerServiceClient
	cfg Config
}

// start boots a shortener. Unless overridden, it talks to a fake limiter
// that allows everything (never a limiter someone else runs on the default
// port, whose rules would throttle the tests).
func start(t testing.TB, overrides map[string]string, h hooks) instance {
	t.Helper()
	env := map[string]string{}
	if _, ok := overrides["KURZ_LIMITER_GRPC_ADDR"]; !ok {
		env["KURZ_LIMITER_GRPC_ADDR"] = limitertest.Start(t, limitertest.AllowAll).Addr()
	}
	maps.Copy(env, overrides)
	cfg := load(t, env)
	srv, err := build(context.Background(), cfg, servertest.Logger(t), h)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	r := servertest.Start(t, srv)
	r.AwaitServing(t, "kurz.shortener.v1.ShortenerService")
	return instance{Running: r, api: shortenerv1.NewShortenerServiceClient(r.Conn), cfg: cfg}
}

// uniq returns a fresh name with prefix: tests share the database and the
// cluster with other runs, so every tenant and alias is new.
func uniq(prefix string) string {
	return prefix + strings.ToLower(rand.Text()[:10])
}

// as returns a context calling as tenant from ip.
func as(tenant, ip string) context.Context {
	return callmeta.Outgoing(context.Background(), tenant, ip)
}

// stores opens test-side handles on PostgreSQL and Redis, and removes the
// tenant's rows and their cache entries when the test ends.
func stores(t testing.TB, cfg Config, tenants ...string) (*pgxpool.Pool, *redis.ClusterClient) {
	t.Helper()
	ctx := context.Background()
	db, err := pgpool.New(ctx, cfg.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	rdb, err := redisconn.New(ctx, cfg.Redis)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, tenant := range tenants {
			rows, err := db.Query(ctx, `DELETE FROM links WHERE tenant = $1 RETURNING code`, tenant)
			if err == nil {
				codes, _ := pgx.CollectRows(rows, pgx.RowTo[string])
				pipe := rdb.Pipeline()
				for _, c := range codes {
					pipe.Del(ctx, linkcache.Key(c))
				}
				_, _ = pipe.Exec(ctx)
			}
		}
		db.Close()
		_ = rdb.Close()
	})
	return db, rdb
}

// wantStatus fails unless err is a status with code c, and returns its
// ErrorInfo reason (empty without one).
func wantStatus(t *testing.T, err error, c codes.Code) (reason string, st *status.Status) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != c {
		t.Fatalf("got %v, want code %s", err, c)
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			if info.GetDomain() != "kurz.dev" {
				t.Errorf("ErrorInfo domain %q, want kurz.dev", info.GetDomain())
			}
			return info.GetReason(), st
		}
	}
	return "", st
}

// metricValue sums every series of a Prometheus metric on the service's
// /metrics.
func metricValue(t *testing.T, r *servertest.Running, name string) float64 {
	t.Helper()
	return metricAt(t, r.HTTP, name)
}

// metricAt sums every series of a Prometheus metric on base + "/metrics".
func metricAt(t *testing.T, base, name string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	body := string(b)
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// queryCounter is a pgx tracer counting statements that contain a substring.
type queryCounter struct {
	substr string
	n      atomic.Int64
}

func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, q.substr) {
		q.n.Add(1)
	}
	return ctx
}

func (q *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// await polls cond (bounded) until it holds.
func await(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	if !servertest.Eventually(within, cond) {
		t.Fatalf("%s: not within %v", what, within)
	}
}

// firstBlockID makes a fresh instance's first link and returns its ID: the
// first of a block of the default size, so the block's next IDs are the
// instance's own.
func firstBlockID(ctx context.Context, t *testing.T, sh instance) int64 {
	t.Helper()
	resp, err := sh.api.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/first"})
	if err != nil {
		t.Fatal(err)
	}
	id, ok := testCodes.ID(resp.GetLink().GetCode())
	if !ok || id%1000 != 0 {
		t.Fatalf("first code %q is of ID %d, want the first of a block", resp.GetLink().GetCode(), id)
	}
	return id
}
