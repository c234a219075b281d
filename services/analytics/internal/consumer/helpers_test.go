//go:build integration

package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	analyticsv1 "kurz.dev/gen/kurz/analytics/v1"
	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/testkit/limitertest"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/analytics/internal/clickstore"
	"kurz.dev/services/analytics/internal/stats"
)

// testShards is the shard count of every test's streams: enough to spread
// over the three masters.
const testShards = 4

// env is one test's world: real Redis Cluster and ClickHouse (database
// kurz_test under `make test`), its own stream prefix, group and tenant so
// that tests running side by side never see each other's events.
type env struct {
	t      testing.TB
	cfg    envConfig
	rdb    *redis.ClusterClient
	ch     driver.Conn
	store  *clickstore.Store
	prefix string
	group  string
	tenant string
	// base is the time of the test's first click: three days ago, so that
	// the first-visit hashes expire within the hour.
	base time.Time
}

type envConfig struct {
	Redis      redisconn.Config
	ClickHouse chconn.Config
}

func newEnv(t testing.TB) *env {
	t.Helper()
	var cfg envConfig
	if err := config.LoadFrom(servertest.Env(nil), &cfg); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, cfg: cfg, prefix: "t-" + rnd(), group: "g-" + rnd(), tenant: "tenant-" + rnd(),
		base: time.Now().UTC().Truncate(24 * time.Hour).Add(-72*time.Hour + 10*time.Hour)}
	e.rdb, e.ch = e.clients()
	if err := clickstore.Apply(context.Background(), e.ch, clickstore.LayoutOf(e.cfg.ClickHouse)); err != nil {
		t.Fatal(err)
	}
	e.store = clickstore.New(e.ch, clickstore.LayoutOf(e.cfg.ClickHouse))
	keys := clickevent.StreamKeys(testShards)
	t.Cleanup(func() {
		ctx := context.Background()
		for _, k := range keys {
			tag := k[len(DefaultStreamPrefix):]
			e.rdb.Del(ctx, e.prefix+tag, e.prefix+"-dead"+tag)
		}
	})
	return e
}

// clients opens a Redis client and a ClickHouse connection that close when
// the test ends (closing twice is harmless).
func (e *env) clients() (*redis.ClusterClient, driver.Conn) {
	e.t.Helper()
	ctx := context.Background()
	rdb, err := redisconn.New(ctx, e.cfg.Redis)
	if err != nil {
		e.t.Fatal(err)
	}
	ch, err := chconn.New(ctx, e.cfg.ClickHouse)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = rdb.Close(); _ = ch.Close() })
	return rdb, ch
}

func rnd() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// opts returns Options for this env with test-friendly timings.
func (e *env) opts() Options {
	return Options{
		Shards: testShards, StreamPrefix: e.prefix, Group: e.group, Name: "c-" + rnd(),
		BatchSize: 500, BatchAge: 50 * time.Millisecond, ReadBlock: 200 * time.Millisecond,
		ClaimIdle: time.Second, ClaimEvery: 200 * time.Millisecond,
		RetryMin: 50 * time.Millisecond, RetryMax: 400 * time.Millisecond,
		InsertTimeout: 5 * time.Second, DrainTimeout: 5 * time.Second,
		// As in production: the stack's masters have a replica each.
		ReadReplicas: 1,
	}
}

// running is a consumer started by start.
type running struct {
	c      *Consumer
	cancel context.CancelFunc
	done   chan struct{}
	reader *sdkmetric.ManualReader
}

// stop cancels the consumer and waits (bounded) for Run to return.
func (r *running) stop(t testing.TB) {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(20 * time.Second):
		t.Fatal("consumer did not stop within 20s")
	}
}

// start runs a consumer over rdb and store until the test ends.
func (e *env) start(opts Options, rdb redis.UniversalClient, store *clickstore.Store, q QuotaChecker) *running {
	e.t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	log := servertest.Logger(e.t)
	if _, bench := e.t.(*testing.B); bench {
		log = slog.New(slog.DiscardHandler)
	}
	c, err := New(rdb, store, q, log, mp, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, done: make(chan struct{}), reader: reader}
	go func() { c.Run(ctx); close(r.done) }()
	e.t.Cleanup(func() { r.stop(e.t) })
	return r
}

// crashAfterInsert runs a consumer A until its first batch is in ClickHouse
// and, before A acknowledges anything, runs blocked (if not nil) and kills
// A: cut off from Redis and ClickHouse, then let go on.
func (e *env) crashAfterInsert(q QuotaChecker, blocked func()) {
	e.t.Helper()
	rdbA, chA := e.clients()
	inserted, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	optsA := e.opts()
	optsA.DrainTimeout = 200 * time.Millisecond
	optsA.hooks.afterInsert = func(context.Context, int) {
		once.Do(func() { close(inserted); <-release })
	}
	a := e.start(optsA, rdbA, clickstore.New(chA, clickstore.LayoutOf(e.cfg.ClickHouse)), q)
	select {
	case <-inserted:
	case <-time.After(20 * time.Second):
		e.t.Fatal("consumer A never inserted")
	}
	if blocked != nil {
		blocked()
	}
	a.cancel()
	_ = rdbA.Close()
	_ = chA.Close()
	close(release)
	a.stop(e.t)
}

// allowAll is a limiter client over a fake limiter that allows everything.
func allowAll(t testing.TB) *quota.Client {
	return limiterClient(t, limitertest.Start(t, limitertest.AllowAll).Addr(), time.Second)
}

func limiterClient(t testing.TB, addr string, timeout time.Duration) *quota.Client {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	q, err := quota.New(conn, timeout, servertest.Logger(t), sdkmetric.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// countingLimiter is the clicks/per-visitor rule in miniature: at most limit
// units per (code, visitor), all or nothing per call, like the limiter.
func countingLimiter(limit int64) limitertest.Decider {
	var mu sync.Mutex
	used := make(map[string]int64)
	return func(req *ratelimitv1.CheckQuotaRequest) *ratelimitv1.CheckQuotaResponse {
		if req.GetDomain() != FloodDomain {
			return limitertest.AllowAll(req)
		}
		cost := int64(req.GetCost())
		if req.Cost == nil {
			cost = 1
		}
		k := req.GetDescriptors()["code"] + "\x00" + req.GetDescriptors()["visitor"]
		mu.Lock()
		defer mu.Unlock()
		ok := used[k]+cost <= limit
		if ok {
			used[k] += cost
		}
		return &ratelimitv1.CheckQuotaResponse{Allowed: ok, DecidingRule: "clicks/per-visitor", Limit: limit,
			Remaining: limit - used[k], Source: ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS}
	}
}

// click returns an event of this env's tenant.
func (e *env) click(code string, at time.Duration, visitor, ua, ref string) clickevent.Event {
	return clickevent.Event{
		ID: clickevent.NewID(e.base.Add(at)), Code: code, Tenant: e.tenant, Time: e.base.Add(at),
		Visitor: visitor, UserAgent: ua, Referrer: ref,
	}
}

// xadd appends events the way the redirect service does (clickevent.Values
// on the shard keys), spread over the shards, and returns the entry IDs.
func (e *env) xadd(events ...clickevent.Event) []string {
	e.t.Helper()
	ctx := context.Background()
	keys := e.streams()
	pipe := e.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(events))
	for i, ev := range events {
		cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: keys[i%len(keys)], MaxLen: 100000, Approx: true, ID: "*", Values: ev.Values()})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		e.t.Fatalf("xadd: %v", err)
	}
	ids := make([]string, len(cmds))
	for i, c := range cmds {
		ids[i] = c.Val()
	}
	return ids
}

// xaddRaw appends arbitrary fields to shard 0.
func (e *env) xaddRaw(values ...string) string {
	e.t.Helper()
	id, err := e.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: e.streams()[0], Values: values}).Result()
	if err != nil {
		e.t.Fatalf("xadd: %v", err)
	}
	return id
}

func (e *env) streams() []string {
	var out []string
	for _, k := range clickevent.StreamKeys(testShards) {
		out = append(out, e.prefix+k[len(DefaultStreamPrefix):])
	}
	return out
}

// pending is the number of entries delivered to the group and not
// acknowledged, over every shard.
func (e *env) pending() int64 {
	e.t.Helper()
	var n int64
	for _, k := range e.streams() {
		p, err := e.rdb.XPending(context.Background(), k, e.group).Result()
		if err != nil {
			if redis.HasErrorPrefix(err, "NOGROUP") {
				continue
			}
			e.t.Fatalf("xpending %s: %v", k, err)
		}
		n += p.Count
	}
	return n
}

// cutClickHouse returns a store whose connection goes through a proxy to
// ClickHouse, cut (restore reconnects it), closed with the test.
func (e *env) cutClickHouse(t *testing.T) (*proxy, *clickstore.Store) {
	t.Helper()
	p := startProxy(t, e.cfg.ClickHouse.Addrs[0])
	cfg := e.cfg.ClickHouse
	cfg.Addrs, cfg.DialTimeout = []string{p.addr}, 500*time.Millisecond
	ch, err := chconn.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.Close() })
	p.cut()
	return p, clickstore.New(ch, clickstore.LayoutOf(cfg))
}

// memberships counts the streams whose group lists the consumer name.
func (e *env) memberships(name string) int {
	e.t.Helper()
	n := 0
	for _, k := range e.streams() {
		cs, err := e.rdb.XInfoConsumers(context.Background(), k, e.group).Result()
		if err != nil {
			if redis.HasErrorPrefix(err, "NOGROUP") {
				continue
			}
			e.t.Fatalf("xinfo consumers %s: %v", k, err)
		}
		if slices.ContainsFunc(cs, func(c redis.XInfoConsumer) bool { return c.Name == name }) {
			n++
		}
	}
	return n
}

// rows counts the raw rows of code (duplicates included).
func (e *env) rows(code string) uint64 {
	e.t.Helper()
	var n uint64
	if err := e.ch.QueryRow(context.Background(),
		"SELECT count() FROM "+clickstore.EventsTable+" WHERE tenant = ? AND code = ?", e.tenant, code).Scan(&n); err != nil {
		e.t.Fatalf("count rows: %v", err)
	}
	return n
}

// stats asks GetLinkStats for code over the test's days.
func (e *env) stats(code string) *analyticsv1.GetLinkStatsResponse {
	e.t.Helper()
	svc := stats.New(e.store, servertest.Logger(e.t), stats.Options{})
	ctx := callmeta.WithVerifiedTenant(context.Background(), e.tenant)
	resp, err := svc.GetLinkStats(ctx, &analyticsv1.GetLinkStatsRequest{
		Code:      code,
		StartTime: tspb(e.base.Add(-24 * time.Hour)), EndTime: tspb(e.base.Add(48 * time.Hour)),
		Interval: analyticsv1.Interval_INTERVAL_DAY,
	})
	if err != nil {
		e.t.Fatalf("GetLinkStats(%s): %v", code, err)
	}
	return resp
}

// eventually polls cond until it holds, or fails the test with what and
// the state cond last reported.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if held, state := servertest.EventuallyState(timeout, cond); !held {
		t.Fatalf("%s: not within %s; last state: %s", what, timeout, state)
	}
}

// proxy is a TCP forwarder to ClickHouse that a test can cut and restore,
// so that an outage never touches the shared server.
type proxy struct {
	t      *testing.T
	target string
	addr   string
	mu     sync.Mutex
	lis    net.Listener
	conns  map[net.Conn]bool
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	p := &proxy{t: t, target: target, conns: make(map[net.Conn]bool)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = lis.Addr().String()
	p.serve(lis)
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) serve(lis net.Listener) {
	p.mu.Lock()
	p.lis = lis
	p.mu.Unlock()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go p.forward(c)
		}
	}()
}

func (p *proxy) forward(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if p.lis == nil { // cut meanwhile
		p.mu.Unlock()
		_ = c.Close()
		_ = up.Close()
		return
	}
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	go func() { _, _ = io.Copy(up, c); _ = up.Close(); _ = c.Close() }()
	go func() { _, _ = io.Copy(c, up); _ = up.Close(); _ = c.Close() }()
}

// cut closes the listener and every forwarded connection: ClickHouse is
// unreachable through the proxy until restore.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lis != nil {
		_ = p.lis.Close()
		p.lis = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

// restore listens again on the same address.
func (p *proxy) restore() {
	p.t.Helper()
	var lis net.Listener
	var err error
	for range 50 { // the port is ours; a just-closed socket may linger briefly
		if lis, err = net.Listen("tcp", p.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		p.t.Fatalf("proxy restore on %s: %v", p.addr, err)
	}
	p.serve(lis)
}

func tspb(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

func visitor(i int) string { return fmt.Sprintf("%032x", i+1) }

// stall holds a consumer inside one of its hooks: the first call blocks
// until free.
type stall struct {
	reached, release chan struct{}
	hit, freed       sync.Once
}

func newStall() *stall {
	return &stall{reached: make(chan struct{}), release: make(chan struct{})}
}

// hook is the hook to install (beforeInsert or afterInsert).
func (s *stall) hook(context.Context, int) {
	s.hit.Do(func() { close(s.reached); <-s.release })
}

// await waits until the consumer is held, and frees it when the test ends
// at the latest: this cleanup runs before the consumer's stop (registered
// earlier, by start), so a failing test does not leave it stuck.
func (s *stall) await(t testing.TB, never string) {
	t.Helper()
	t.Cleanup(s.free)
	select {
	case <-s.reached:
	case <-time.After(20 * time.Second):
		t.Fatal(never)
	}
}

// free lets the held consumer go on.
func (s *stall) free() { s.freed.Do(func() { close(s.release) }) }
