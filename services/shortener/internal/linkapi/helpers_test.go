package linkapi_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/capacity"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/services/shortener/internal/codegen"
	"kurz.dev/services/shortener/internal/linkapi"
	"kurz.dev/services/shortener/internal/linkstore/linkstoretest"
	"kurz.dev/services/shortener/internal/urlcheck"
)

// baseURL is the short links' base in these tests.
const baseURL = "https://kurz.test"

// env is one Service served in process over bufconn, on fakes: the link
// store, the limiter and the Redis cache.
type env struct {
	client shortenerv1.ShortenerServiceClient
	// svc is the Service behind client, for what has no RPC (the sweep).
	svc     *linkapi.Service
	store   *linkstoretest.Fake
	limiter *limitertest.Server
	cache   *cache
}

// newEnv serves a Service that allows every quota check; edit changes its
// options.
func newEnv(t *testing.T, edit ...func(*linkapi.Options)) *env {
	t.Helper()
	return newEnvWith(t, nil, edit...)
}

// newEnvWith is newEnv with deps completing the Service's collaborators
// (custom domains' store and resolver) before it is built.
func newEnvWith(t *testing.T, deps func(*linkapi.Deps), edit ...func(*linkapi.Options)) *env {
	t.Helper()
	e := &env{store: linkstoretest.New(), limiter: limitertest.Start(t, limitertest.AllowAll), cache: newCache()}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	mp := noop.NewMeterProvider()
	lim, err := grpc.NewClient(e.limiter.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	q, err := quota.New(lim, 5*time.Second, log, mp)
	if err != nil {
		t.Fatal(err)
	}
	perm, err := linkcode.NewPermutation([]byte("linkapi-unit-test-code-key-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	fromURL, err := codegen.NewFromURL([]byte("linkapi-unit-test-code-key-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	opts := linkapi.Options{BaseURL: baseURL, CacheTTL: time.Hour, CacheTimeout: time.Second,
		LimiterPolicy: quota.FailClosed, RetryInterval: time.Second, RetryMaxDelay: time.Minute}
	for _, f := range edit {
		f(&opts)
	}
	d := linkapi.Deps{
		Store: e.store, Redis: e.cache,
		Blocks:  codegen.NewBlocks(e.store.NextBlocks, 100, perm, nil),
		Random:  codegen.NewRandom(nil, 8),
		FromURL: fromURL,
		Policy:  urlcheck.Policy{MaxLength: 2048},
		Scanner: urlcheck.Nothing{},
		Quota:   q,
		Hashes:  capacity.New(2, time.Second),
		Log:     log,
		Meter:   mp.Meter("linkapi_test"),
	}
	if deps != nil {
		deps(&d)
	}
	svc, err := linkapi.New(opts, d)
	if err != nil {
		t.Fatal(err)
	}
	e.svc = svc

	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.UnaryInterceptor(verifyTenant))
	shortenerv1.RegisterShortenerServiceServer(srv, svc)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///linkapi", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	e.client = shortenerv1.NewShortenerServiceClient(conn)
	return e
}

// verifyTenant stands in for svcauth's server interceptor: it believes the
// caller's x-kurz-tenant, which svcauth would have checked against the
// call's signed assertion.
func verifyTenant(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(callmeta.TenantKey)) > 0 {
		ctx = callmeta.WithVerifiedTenant(ctx, md.Get(callmeta.TenantKey)[0])
	}
	return handler(ctx, req)
}

// as is a context calling as tenant (none: "") from a fixed client IP.
func as(tenant string) context.Context {
	return callmeta.Outgoing(context.Background(), tenant, "203.0.113.7")
}

// wantStatus fails t unless err is a status of code c whose ErrorInfo (if
// reason is not empty) has reason and, if field is not empty, names field.
func wantStatus(t *testing.T, what string, err error, c codes.Code, reason, field string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != c {
		t.Errorf("%s: %v, want %v", what, err, c)
		return
	}
	if reason == "" {
		return
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			if info.GetReason() != reason || info.GetDomain() != rpcerr.Domain || info.GetMetadata()["field"] != field {
				t.Errorf("%s: ErrorInfo %v, want reason %s, domain %s, field %q", what, info, reason, rpcerr.Domain, field)
			}
			return
		}
	}
	t.Errorf("%s: %v carries no ErrorInfo, want reason %s", what, err, reason)
}

// cache is the Redis of the write-through: it keeps what the service sets
// and deletes, and the codes it publishes. Commands the service is not
// expected to send panic (the embedded Cmdable is nil).
type cache struct {
	redis.Cmdable
	mu        sync.Mutex
	values    map[string]string
	published []string
	// onChannel is what was published by channel.
	onChannel map[string][]string
	// getErr, if set, is every GET's answer (Redis unreachable).
	getErr error
	// gets counts the GETs sent on their own, readPipelines the pipelines
	// run with GETs in them (each one round trip).
	gets, readPipelines int
}

func (c *cache) Get(ctx context.Context, key string) *redis.StringCmd {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gets++
	return c.read(redis.NewStringCmd(ctx, "get", key))
}

// read answers the GET cmd from values; the caller holds mu.
func (c *cache) read(cmd *redis.StringCmd) *redis.StringCmd {
	v, ok := c.values[cmd.Args()[1].(string)]
	switch {
	case c.getErr != nil:
		cmd.SetErr(c.getErr)
	case !ok:
		cmd.SetErr(redis.Nil)
	default:
		cmd.SetVal(v)
	}
	return cmd
}

// reads returns and resets the counts of GETs and of pipelines with GETs.
func (c *cache) reads() (gets, pipelines int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	gets, pipelines = c.gets, c.readPipelines
	c.gets, c.readPipelines = 0, 0
	return gets, pipelines
}

// setVisits sets code's visit counter, as the redirect's INCRs would.
func (c *cache) setVisits(code string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.values[linkcache.VisitsKey(code)] = strconv.Itoa(n)
}

func newCache() *cache { return &cache{values: make(map[string]string)} }

func (c *cache) Set(ctx context.Context, key string, value any, _ time.Duration) *redis.StatusCmd {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.values[key] = value.(string)
	return redis.NewStatusResult("OK", nil)
}

func (c *cache) Publish(ctx context.Context, channel string, message any) *redis.IntCmd {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.published = append(c.published, message.(string))
	if c.onChannel == nil {
		c.onChannel = map[string][]string{}
	}
	c.onChannel[channel] = append(c.onChannel[channel], message.(string))
	return redis.NewIntResult(1, nil)
}

func (c *cache) Del(ctx context.Context, keys ...string) *redis.IntCmd {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		delete(c.values, k)
	}
	return redis.NewIntResult(int64(len(keys)), nil)
}

// EvalSha runs the one script the service sends, linkcache.WriteCreated's:
// keys[0] takes args[0] unless an entry other than a negative one is
// there, and args[3] (the code) is published either way. Eval is the same
// (the fake holds every script).
func (c *cache) EvalSha(ctx context.Context, _ string, keys []string, args ...any) *redis.Cmd {
	c.mu.Lock()
	defer c.mu.Unlock()
	written := int64(0)
	cur, ok := c.values[keys[0]]
	if e, err := linkcache.Unmarshal(cur); !ok || err != nil || e.State == linkcache.Missing {
		c.values[keys[0]] = args[0].(string)
		written = 1
	}
	c.published = append(c.published, args[3].(string))
	return redis.NewCmdResult(written, nil)
}

func (c *cache) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return c.EvalSha(ctx, script, keys, args...)
}

// Persist and PExpireAt give a visit counter its link's lifetime: the
// fake checks only that the key exists, as Redis answers, and keeps no TTL.
func (c *cache) Persist(ctx context.Context, key string) *redis.BoolCmd {
	return redis.NewBoolResult(c.has(key), nil)
}

func (c *cache) PExpireAt(ctx context.Context, key string, _ time.Time) *redis.BoolCmd {
	return redis.NewBoolResult(c.has(key), nil)
}

// entry returns code's cache entry; found is false without one.
func (c *cache) entry(t *testing.T, code string) (e linkcache.Entry, found bool) {
	t.Helper()
	c.mu.Lock()
	v, ok := c.values[linkcache.Key(code)]
	c.mu.Unlock()
	if !ok {
		return linkcache.Entry{}, false
	}
	e, err := linkcache.Unmarshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return e, true
}

// has reports whether key is set.
func (c *cache) has(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.values[key]
	return ok
}

// Pipeline is a pipeline whose GETs (a batch's visit counters) read the
// cache when it runs, and whose scripts run nothing: a batch of several
// links writes through to no cache in these tests (a single link's write
// goes through Set).
func (c *cache) Pipeline() redis.Pipeliner { return &pipeline{c: c} }

type pipeline struct {
	redis.Pipeliner
	c    *cache
	gets []*redis.StringCmd
}

func (p *pipeline) Get(ctx context.Context, key string) *redis.StringCmd {
	cmd := redis.NewStringCmd(ctx, "get", key)
	p.gets = append(p.gets, cmd)
	return cmd
}

func (*pipeline) Eval(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return redis.NewCmd(ctx)
}

// Exec answers the GETs, and fails with the first command's error, as a
// pipeline does (redis.Nil included).
func (p *pipeline) Exec(context.Context) ([]redis.Cmder, error) {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	if len(p.gets) == 0 {
		return nil, nil
	}
	p.c.readPipelines++
	var first error
	cmds := make([]redis.Cmder, 0, len(p.gets))
	for _, cmd := range p.gets {
		if err := p.c.read(cmd).Err(); err != nil && first == nil {
			first = err
		}
		cmds = append(cmds, cmd)
	}
	p.gets = nil
	return cmds, first
}
