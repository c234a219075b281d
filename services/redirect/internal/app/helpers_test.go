//go:build integration

package app

import (
	"bufio"
	"context"
	"crypto/rand"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkschema"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/servertest"
)

const testSalt = "redirect-test-salt-0123456789abcdef"

// instance is one in-process redirect pod.
type instance struct {
	*servertest.Running
	cfg Config
}

// start boots a redirect pod. Unless overridden it asks a fake limiter that
// allows everything (a limiter someone runs on the default port would
// throttle the tests' misses) and hashes visitors with testSalt.
func start(t *testing.T, overrides map[string]string, h hooks) instance {
	t.Helper()
	env := map[string]string{"KURZ_REDIRECT_VISITOR_SALT": testSalt}
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
	r.AwaitServing(t, "")
	return instance{Running: r, cfg: cfg}
}

var schemaOnce sync.Once

// fixture gives a test PostgreSQL and Redis handles (with the links schema
// applied), and removes the codes it registers when the test ends.
type fixture struct {
	t     *testing.T
	db    *pgxpool.Pool
	rdb   *redis.ClusterClient
	mu    sync.Mutex
	codes []string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	cfg := load(t, nil)
	ctx := context.Background()
	db, err := pgpool.New(ctx, cfg.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	var schemaErr error
	schemaOnce.Do(func() { _, schemaErr = linkschema.Apply(ctx, db) })
	if schemaErr != nil {
		t.Fatal(schemaErr)
	}
	rdb, err := redisconn.New(ctx, cfg.Redis)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, db: db, rdb: rdb}
	t.Cleanup(func() {
		ctx := context.Background()
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.codes) > 0 {
			_, _ = db.Exec(ctx, `DELETE FROM links WHERE code = ANY($1)`, f.codes)
			for _, c := range f.codes {
				rdb.Del(ctx, linkcache.Key(c))
				rdb.Del(ctx, linkcache.VisitsKey(c))
			}
		}
		db.Close()
		_ = rdb.Close()
	})
	return f
}

// code returns a fresh code (7 characters, like a random one) to be removed
// from PostgreSQL and Redis at the end.
func (f *fixture) code() string {
	c := rand.Text()[:7]
	f.track(c)
	return c
}

func (f *fixture) track(codes ...string) {
	f.mu.Lock()
	f.codes = append(f.codes, codes...)
	f.mu.Unlock()
}

// insert stores a link directly in PostgreSQL (no cache entry).
func (f *fixture) insert(code, tenant, target string, status int, expires *time.Time, disabled bool) {
	f.t.Helper()
	if _, err := f.db.Exec(context.Background(), `INSERT INTO links (code, tenant, long_url, redirect_type, expires_at, disabled)
		VALUES ($1, $2, $3, $4, $5, $6)`, code, tenant, target, status, expires, disabled); err != nil {
		f.t.Fatal(err)
	}
}

// flush deletes code's Redis entry: the transcript's "cache flush", for one
// code only (the cluster is shared).
func (f *fixture) flush(code string) {
	f.t.Helper()
	if err := f.rdb.Del(context.Background(), linkcache.Key(code)).Err(); err != nil {
		f.t.Fatal(err)
	}
}

// client never follows redirects: the tests look at them.
var client = &http.Client{
	Timeout:       30 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Transport:     &http.Transport{MaxIdleConnsPerHost: 64},
}

// get requests base+path (method GET unless given) and returns the response
// with its body drained.
func get(t testing.TB, base, path string, header ...string) *http.Response {
	t.Helper()
	return do(t, http.MethodGet, base+path, header...)
}

func do(t testing.TB, method, url string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	var body strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&body)
	resp.Body.Close()
	resp.Header.Set("X-Test-Body", body.String())
	return resp
}

// metricValue sums every series of a Prometheus metric whose labels contain
// all of with (e.g. `source="db"`).
func metricValue(t *testing.T, r *servertest.Running, name string, with ...string) float64 {
	t.Helper()
	code, body := r.GetOps(t, "/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
lines:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, w := range with {
			if !strings.Contains(line, w) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// lookups is a pgx tracer counting the redirect's link lookups per code; if
// hold is set, each lookup waits for it to close.
type lookups struct {
	mu   sync.Mutex
	n    map[string]int
	hold chan struct{}
}

func (l *lookups) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(d.SQL, "FROM links WHERE code") || len(d.Args) == 0 {
		return ctx
	}
	code, _ := d.Args[0].(string)
	l.mu.Lock()
	if l.n == nil {
		l.n = map[string]int{}
	}
	l.n[code]++
	hold := l.hold
	l.mu.Unlock()
	if hold != nil {
		<-hold
	}
	return ctx
}

func (l *lookups) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *lookups) count(code string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[code]
}

func (l *lookups) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, v := range l.n {
		n += v
	}
	return n
}

// redisCounter is a go-redis hook counting commands by name and first key.
type redisCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *redisCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *redisCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.add(cmd)
		return next(ctx, cmd)
	}
}

func (c *redisCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.add(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *redisCounter) add(cmd redis.Cmder) {
	key := cmd.Name()
	if args := cmd.Args(); len(args) > 1 {
		if s, ok := args[1].(string); ok {
			key += " " + s
		}
	}
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[key]++
	c.mu.Unlock()
}

func (c *redisCounter) count(name, key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name+" "+key]
}

// total counts every command seen.
func (c *redisCounter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.n {
		n += v
	}
	return n
}

// await polls cond (bounded) until it holds and returns how long it took.
func await(t *testing.T, what string, within time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	if !servertest.Eventually(within, cond) {
		t.Fatalf("%s: not within %v", what, within)
	}
	return time.Since(start)
}
