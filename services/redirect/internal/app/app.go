// Package app wires the redirect service: the public HTTP hot path (short
// code to 302) over an in-process L1 cache, Redis Cluster and PostgreSQL; the
// click pipeline into the Redis streams; the limiter on the miss path. Its
// gRPC listener carries health and reflection only.
package app

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/geoip"
	"kurz.dev/pkg/grpcclient"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkdomain"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/server"
	"kurz.dev/services/redirect/internal/clickpipe"
	"kurz.dev/services/redirect/internal/redirector"
	"kurz.dev/services/redirect/internal/resolve"
)

// Config is the redirect service's configuration, from KURZ_* environment
// variables.
type Config struct {
	server.Common
	// GRPCAddr is the redirect's gRPC address (health and reflection only).
	GRPCAddr string `env:"REDIRECT_GRPC_ADDR" default:"127.0.0.1:9094"`
	// HTTPAddr is the public listener: short codes are served at its root.
	HTTPAddr string `env:"REDIRECT_HTTP_ADDR" default:"127.0.0.1:8787"`
	// OpsAddr serves /readyz, /metrics and pprof, kept off the public
	// listener (which answers /healthz only).
	OpsAddr  string `env:"REDIRECT_OPS_ADDR" default:"127.0.0.1:9194"`
	Postgres pgpool.Config
	Redis    redisconn.Config
	Cache    linkcache.Config
	Streams  clickevent.StreamConfig

	// L1TTL is how long a pod keeps an entry it read from Redis: the bound
	// on staleness when an invalidation is lost.
	L1TTL time.Duration `env:"REDIRECT_L1_TTL" default:"5s"`
	// L1Size bounds the L1 cache (entries).
	L1Size int `env:"REDIRECT_L1_SIZE" default:"100000"`
	// L1Bytes bounds the L1 cache by weight, in bytes: an entry's heap
	// estimated from above (512 plus 2 per byte of its Redis encoding, 320
	// per rule condition and 72 per value; a plain link ~1 KiB, one with
	// many rules up to ~250 KiB), so links a stranger makes large cannot
	// grow the process; least recently used entries go first, and one over
	// 1/64 of it is not kept.
	L1Bytes int64 `env:"REDIRECT_L1_BYTES" default:"67108864"`
	// DefaultStatus answers links without their own redirect type: 301, 302,
	// 307 or 308.
	DefaultStatus int `env:"REDIRECT_DEFAULT_STATUS" default:"302"`
	// CDNMaxAge > 0 lets a CDN cache 302/307 answers this long (a link
	// expiring sooner: until its expiry).
	CDNMaxAge time.Duration `env:"REDIRECT_CDN_MAX_AGE" default:"0s"`
	// PermanentMaxAge is the Cache-Control max-age of 301/308 answers (a
	// link expiring sooner: until its expiry).
	PermanentMaxAge time.Duration `env:"REDIRECT_PERMANENT_MAX_AGE" default:"1h"`
	// HomeURL is where the default domain's root ("/", a short domain
	// typed bare) redirects (302), e.g. the site of the company that runs
	// it; empty: a 404 page. A custom domain's root is not the operator's
	// to send anywhere: it stays a 404 page.
	HomeURL string `env:"REDIRECT_HOME_URL" default:""`
	// TrustedProxies are CIDRs (or addresses) of the proxies in front of the
	// service (the ingress pods): only their forwarding headers are
	// believed, X-Forwarded-For walked from the right (pkg/clientip).
	// Empty: every client is its TCP peer.
	// A range wider than 10.0.0.0/8 or fc00::/7 (0.0.0.0/0), or a public
	// IPv6 range wider than /16, is warned of at start: every client in it
	// names its own address.
	TrustedProxies []string `env:"REDIRECT_TRUSTED_PROXIES" default:""`
	// ClientIPHeader optionally names a single-value header (X-Real-IP,
	// CF-Connecting-IP) the trusted proxies set, read instead of
	// X-Forwarded-For. It needs TrustedProxies: it used to be believed
	// from any peer.
	ClientIPHeader string `env:"REDIRECT_CLIENT_IP_HEADER" default:""`
	// Keying keys IPv6 clients by their prefix (KURZ_CLIENT_IPV6_PREFIX).
	Keying clientip.Keying
	// GeoIP is the country database clicks are located with (pkg/geoip).
	GeoIP geoip.Config
	// VisitorSalt keys the visitor hash in click events, at least 32
	// characters (the hash covers the day, IP and user agent: a short key
	// could be found by trying them, and with it every IPv4 address behind
	// a hash), and the A/B-test variant a visitor gets; give every pod the
	// same secret. Empty: a random salt per process, with a warning:
	// visitors then differ per pod, and variants are not sticky, a visitor
	// switching variant from pod to pod and at each restart. Rotating it
	// restarts visitor counting and reassigns every visitor's variant.
	VisitorSalt string `env:"REDIRECT_VISITOR_SALT" default:""`

	// LimiterAddr is where the limiter's gRPC listens.
	LimiterAddr string `env:"LIMITER_GRPC_ADDR" default:"127.0.0.1:9091"`
	// LimiterTimeout bounds one CheckQuota on the miss path.
	LimiterTimeout time.Duration `env:"REDIRECT_LIMITER_TIMEOUT" default:"25ms"`
	// MissFailurePolicy is what the miss path does when the limiter does not
	// answer: open (look up anyway) or closed (503).
	MissFailurePolicy string `env:"REDIRECT_MISS_FAILURE_POLICY" default:"open"`
	// PasswordLimiterTimeout bounds the CheckQuota before a password
	// attempt. That check fails closed (no answer, no attempt), so it gets
	// more room than the miss path's.
	PasswordLimiterTimeout time.Duration `env:"REDIRECT_PASSWORD_LIMITER_TIMEOUT" default:"250ms"`
	// VisitTimeout bounds the INCR that counts a visit of a visit-limited
	// link, waiting for a pooled connection included; past it the visit is
	// refused (503), never let through uncounted.
	VisitTimeout time.Duration `env:"REDIRECT_VISIT_TIMEOUT" default:"500ms"`
	// VisitReplicas is how many Redis replicas must hold a counted visit
	// before it is granted (WAIT): a failover then keeps every granted
	// visit. 0 for a Redis without replicas. Above the replicas a master
	// has online, every visit counted there is refused (503) and spent: the
	// start warns and readiness reports redis_replicas degraded.
	VisitReplicas int `env:"REDIRECT_VISIT_REPLICAS" default:"1"`
	// FormSecret keys the CSRF tokens of password forms; give every pod the
	// same secret (at least 32 characters). Empty: a random secret per
	// process, with a warning (a form then verifies only on the pod that
	// rendered it).
	FormSecret string `env:"REDIRECT_FORM_SECRET" default:""`
	// AllowPublishedSecrets lets the redirect start with a form secret or
	// visitor salt whose value this repository publishes (the dev
	// overlay's, make up's): for local and dev use only. Off, such a value
	// is refused at start: with it anyone forges password-form tokens or
	// reverses visitor hashes.
	AllowPublishedSecrets bool `env:"ALLOW_PUBLISHED_SECRETS" default:"false"`
	// PasswordChecks bounds the Argon2 password checks a pod runs at once,
	// each ~19 MiB and ~33 ms of a core; as many attempts may wait up to
	// 250 ms for one, and the rest are answered 503 at once. 0: GOMAXPROCS,
	// at most 4, so that a pod without a CPU limit on a large node (whose
	// GOMAXPROCS is the node's cores) does not hold 19 MiB a core against
	// its memory limit. 1 to 64.
	PasswordChecks int `env:"REDIRECT_PASSWORD_CHECKS" default:"0"`
	// WalkRate and WalkBurst bound, per client IP and pod, the lookups of
	// codes not in L1 (which is how a client walks existing codes): a token
	// bucket of WalkRate per second holding WalkBurst; past it 429. Popular
	// codes are L1 hits and never count, nor does the same code again.
	WalkRate  float64 `env:"REDIRECT_WALK_RATE" default:"10"`
	WalkBurst int     `env:"REDIRECT_WALK_BURST" default:"1000"`

	// DefaultHosts are the host names (no port) that serve the default
	// domain's links; a request for any other host that is not a verified
	// custom domain answers 404. Empty: every host that is not a custom
	// domain serves the default domain, once the custom domains were read
	// (before, none does, and the replica is not ready). Each must be the
	// host of KURZ_SHORTENER_BASE_URL or in KURZ_SHORTENER_OWN_HOSTS: the
	// shortener refuses only those as targets, and a link to another name
	// served here redirects back here (only a loop of one hop answers 508).
	// Set it in production: empty serves names the shortener cannot list.
	DefaultHosts []string `env:"REDIRECT_DEFAULT_HOSTS" default:""`
	// DomainRefresh is how often the set of verified custom domains is
	// read from PostgreSQL besides the reads the shortener's change
	// messages trigger: the longest a newly verified (or deleted) domain
	// waits to be served (or refused) when such a message is lost. At
	// least 100ms: each refresh reads every verified domain.
	DomainRefresh time.Duration `env:"REDIRECT_DOMAIN_REFRESH" default:"10s"`
	// SuspensionRefresh is how often the suspended tenants are read from
	// PostgreSQL (tenant_suspensions, which the gateway's admin API
	// writes): a suspension or a resume takes effect on every replica
	// within this plus one read (at most KURZ_POSTGRES_QUERY_TIMEOUT).
	// From 100ms to 1m: each refresh reads every suspended tenant, a small
	// table, and a stop button must stop soon.
	SuspensionRefresh time.Duration `env:"REDIRECT_SUSPENSION_REFRESH" default:"2s"`

	// ClickBuffer is how many click events may wait in memory; more are
	// dropped and counted. At most 50000: its slots are allocated at start
	// (184 bytes each) and a waiting click holds up to ~1.4 KiB with its
	// user agent and referrer, so a full buffer (~66 MiB) fits beside L1
	// in the pods' memory.
	ClickBuffer int `env:"REDIRECT_CLICK_BUFFER" default:"10000"`
	// ClickBatch is the most events one XADD pipeline carries, at most
	// 1000. Each stream shard's writer holds up to one batch besides the
	// buffer while it writes.
	ClickBatch int `env:"REDIRECT_CLICK_BATCH" default:"256"`
	// ClickFlushInterval is how long a writer waits to fill a batch, at
	// least 10ms: every stream shard's writer wakes this often, clicks or
	// none.
	ClickFlushInterval time.Duration `env:"REDIRECT_CLICK_FLUSH_INTERVAL" default:"100ms"`
	// ClickWriteTimeout bounds one batch's round trip to Redis.
	ClickWriteTimeout time.Duration `env:"REDIRECT_CLICK_WRITE_TIMEOUT" default:"1s"`
}

// Check runs validate for server.Main, before the service starts.
func (c Config) Check() error {
	_, _, err := c.validate()
	return errors.Join(err, c.Redis.Check(), c.Postgres.Check())
}

func (c Config) validate() (quota.Policy, *clientip.Policy, error) {
	var errs []error
	policy, err := quota.ParsePolicy(c.MissFailurePolicy)
	if err != nil {
		errs = append(errs, fmt.Errorf("KURZ_REDIRECT_MISS_FAILURE_POLICY: %w", err))
	}
	clients, err := clientip.New(c.TrustedProxies, c.ClientIPHeader)
	if err != nil {
		errs = append(errs, fmt.Errorf("KURZ_REDIRECT_TRUSTED_PROXIES / KURZ_REDIRECT_CLIENT_IP_HEADER: %w", err))
	}
	switch c.DefaultStatus {
	case 301, 302, 307, 308:
	default:
		errs = append(errs, fmt.Errorf("KURZ_REDIRECT_DEFAULT_STATUS=%d: want 301, 302, 307 or 308", c.DefaultStatus))
	}
	if err := redirector.CheckHomeURL(c.HomeURL); err != nil {
		errs = append(errs, fmt.Errorf("KURZ_REDIRECT_HOME_URL: %w", err))
	}
	if c.L1TTL <= 0 || c.L1Size < 1 {
		errs = append(errs, errors.New("KURZ_REDIRECT_L1_TTL and KURZ_REDIRECT_L1_SIZE must be positive"))
	}
	if c.L1Bytes < 1<<20 {
		errs = append(errs, fmt.Errorf("KURZ_REDIRECT_L1_BYTES=%d: want at least 1048576 (1 MiB)", c.L1Bytes))
	}
	if c.ClickBuffer < 1 || c.ClickBuffer > maxClickBuffer {
		errs = append(errs, fmt.Errorf("KURZ_REDIRECT_CLICK_BUFFER=%d: want 1 to %d", c.ClickBuffer, maxClickBuffer))
	}
	if c.ClickBatch < 1 || c.ClickBatch > maxClickBatch {
		errs = append(errs, fmt.Errorf("KURZ_REDIRECT_CLICK_BATCH=%d: want 1 to %d", c.ClickBatch, maxClickBatch))
	}
	if c.ClickWriteTimeout <= 0 {
		errs = append(errs, errors.New("KURZ_REDIRECT_CLICK_WRITE_TIMEOUT must be positive"))
	}
	if c.LimiterTimeout <= 0 || c.PasswordLimiterTimeout <= 0 || c.VisitTimeout <= 0 {
		errs = append(errs, errors.New("KURZ_REDIRECT_LIMITER_TIMEOUT, KURZ_REDIRECT_PASSWORD_LIMITER_TIMEOUT and KURZ_REDIRECT_VISIT_TIMEOUT must be positive"))
	}
	errs = append(errs,
		config.Period("KURZ_REDIRECT_CLICK_FLUSH_INTERVAL", c.ClickFlushInterval, 10*time.Millisecond),
		config.Period("KURZ_REDIRECT_DOMAIN_REFRESH", c.DomainRefresh, 100*time.Millisecond),
		config.Period("KURZ_REDIRECT_SUSPENSION_REFRESH", c.SuspensionRefresh, 100*time.Millisecond),
		config.PeriodOrOff("KURZ_GEOIP_RELOAD_INTERVAL", c.GeoIP.ReloadInterval, time.Second))
	for _, h := range c.DefaultHosts {
		if h == "" || linkdomain.Host(h) != h {
			errs = append(errs, fmt.Errorf("KURZ_REDIRECT_DEFAULT_HOSTS: %q is not a lower-case host name without a port", h))
		}
	}
	if c.SuspensionRefresh > maxSuspensionRefresh {
		errs = append(errs, fmt.Errorf("KURZ_REDIRECT_SUSPENSION_REFRESH=%s: want at most %s, or a suspended tenant's links redirect that long", c.SuspensionRefresh, maxSuspensionRefresh))
	}
	if c.PasswordChecks < 0 || c.PasswordChecks > maxPasswordChecks {
		errs = append(errs, fmt.Errorf("KURZ_REDIRECT_PASSWORD_CHECKS=%d: want 0 (the default) to %d", c.PasswordChecks, maxPasswordChecks))
	}
	if c.VisitReplicas < 0 {
		errs = append(errs, errors.New("KURZ_REDIRECT_VISIT_REPLICAS must be 0 or more"))
	}
	if err := redirector.CheckWalkBound(c.WalkRate, c.WalkBurst); err != nil {
		errs = append(errs, fmt.Errorf("KURZ_REDIRECT_WALK_RATE, KURZ_REDIRECT_WALK_BURST: %w", err))
	}
	for _, v := range []struct{ name, secret string }{
		{"KURZ_REDIRECT_FORM_SECRET", c.FormSecret}, {"KURZ_REDIRECT_VISITOR_SALT", c.VisitorSalt},
	} {
		if n := len(v.secret); n > 0 && n < minSecretLen {
			errs = append(errs, fmt.Errorf("%s has %d characters: want at least %d", v.name, n, minSecretLen))
		}
		errs = append(errs, config.NotPublished(v.name, v.secret, c.AllowPublishedSecrets))
	}
	errs = append(errs, c.Cache.Validate(), c.Streams.Validate(), c.Keying.Check())
	return policy, clients, errors.Join(errs...)
}

// maxClickBuffer bounds KURZ_REDIRECT_CLICK_BUFFER. The buffer is a
// channel of events allocated whole at start, 184 bytes a slot, and a
// waiting click holds ~1.2 KiB more when its user agent and referrer are
// as long as they are kept (512 bytes each). 50,000 of those are ~66 MiB:
// with L1's default 64 MiB that stays well inside the 200 MiB GOMEMLIMIT of
// the pods (deploy/k8s), where 2,000,000 took 368 MB before the first click
// and kept an idle pod's collector busy.
const maxClickBuffer = 50_000

// maxClickBatch bounds KURZ_REDIRECT_CLICK_BATCH. Each stream shard's
// writer allocates a batch's slots at start and holds a full batch beside
// the buffer while it writes (8 shards x 1,000 at the largest: ~11 MiB);
// one pipeline of 1,000 XADDs already makes the round trip negligible.
const maxClickBatch = 1_000

// minSecretLen is the shortest KURZ_REDIRECT_FORM_SECRET and
// KURZ_REDIRECT_VISITOR_SALT accepted.
const minSecretLen = 32

// maxPasswordChecks bounds KURZ_REDIRECT_PASSWORD_CHECKS: 64 checks at once
// hold 1.2 GiB.
const maxPasswordChecks = 64

// Build wires the redirect service within lc: its stores, then its server,
// the limiter clients, the lookup path, the click pipeline and the HTTP
// handler. The main passes it to server.Main.
func Build(ctx context.Context, cfg Config, lc *server.Lifecycle, log *slog.Logger) (*server.Server, error) {
	return hooks{}.wire(ctx, cfg, lc, log)
}

// New starts the redirect service in process, as server.Main does before
// Run.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*server.Server, error) {
	return server.Start(ctx, cfg, log, Build)
}

// build is New with test hooks.
func build(ctx context.Context, cfg Config, log *slog.Logger, h hooks) (*server.Server, error) {
	return server.Start(ctx, cfg, log, h.wire)
}

// hooks let in-package tests observe and steer I/O; zero values are no-ops.
type hooks struct {
	pgTracer  pgx.QueryTracer
	redisHook redis.Hook
	// clickRedis replaces the cluster client for click events only.
	clickRedis redis.Cmdable
	// visitRedis replaces the cluster client for visit counters only.
	visitRedis redis.Cmdable
	// beforeFlight runs when a request misses L1.
	beforeFlight func(code string)
	// afterInvalidate runs when an invalidation of code was applied to L1.
	afterInvalidate func(code string)
}

// wire is Build with test hooks.
func (h hooks) wire(ctx context.Context, cfg Config, lc *server.Lifecycle, log *slog.Logger) (*server.Server, error) {
	missPolicy, clients, err := cfg.validate()
	if err != nil {
		return nil, fmt.Errorf("configuration:\n%w", err)
	}
	// The database before the stores: a bad file fails the start at once.
	geo, err := openGeoIP(cfg.GeoIP, lc, log)
	if err != nil {
		return nil, err
	}
	rdb, db, err := h.openStores(ctx, cfg, lc)
	if err != nil {
		return nil, err
	}
	srvCfg := cfg.Config(cfg.GRPCAddr, cfg.HTTPAddr)
	srvCfg.OpsAddr = cfg.OpsAddr
	srvCfg.GRPCMaxRecvMsgSize = server.SmallGRPCMaxRecvMsgSize // health and reflection alone
	srv, err := server.New(ctx, "redirect", srvCfg, lc, log)
	if err != nil {
		return nil, err
	}
	meter := srv.Telemetry.MeterProvider.Meter("kurz.dev/services/redirect")
	if geo != nil {
		if err := observeGeoIP(meter, geo); err != nil {
			return nil, fmt.Errorf("redirect metrics: %w", err)
		}
	}
	deps, err := h.handlerDeps(ctx, cfg, rdb, db, srv, lc, log, meter)
	if err != nil {
		return nil, err
	}
	handler, err := newHandler(cfg, missPolicy, clients, geo, deps, meter)
	if err != nil {
		return nil, err
	}
	handler.Register(srv.Mux)
	// Every route reads the host from the Host header: a request line
	// naming one is refused before any of them (redirector.OriginForm).
	srv.SetHandler(redirector.OriginForm(srv.Mux))
	// A public listener: trace context only through the trusted proxies.
	srv.TrustTraceContextFrom(clients.FromTrustedProxy)
	// ... and a client's connections counted as its limits count it, the
	// proxies' not at all.
	srv.KeyClientConnections(cfg.Keying, clients.Trusted)
	// Each store backs the other (and L1 both): a redirect replica serves
	// what it can through either outage, and no other replica does better.
	srv.AddSoftCheck("redis", func(ctx context.Context) error { return redisconn.Check(ctx, rdb) })
	srv.AddSoftCheck("postgres", db.Ping)
	if cfg.VisitReplicas > 0 {
		// Fewer replicas than WAIT asks for refuses every visit-limited
		// link on those masters; the pod still serves every other link.
		srv.AddSoftCheck("redis_replicas", redisconn.WarnReplicasHeld(ctx, log, rdb, "KURZ_REDIRECT_VISIT_REPLICAS", cfg.VisitReplicas,
			"visits of visit-limited links counted there are refused (503) and still spent",
			"visits of visit-limited links may all be refused"))
	}
	if w := clients.Warning(); w != "" {
		log.Warn(w, "variable", "KURZ_REDIRECT_TRUSTED_PROXIES")
	}
	log.Info("redirect configured", "l1_ttl", cfg.L1TTL, "default_status", cfg.DefaultStatus,
		"click_streams", cfg.Streams.Shards, "limiter", cfg.LimiterAddr, "miss_failure_policy", missPolicy.String(),
		"client_ip", clients.String(), "client_ipv6_prefix", cfg.Keying.IPv6Prefix)
	return srv, nil
}

// openStores connects to Redis Cluster and PostgreSQL.
func (h hooks) openStores(ctx context.Context, cfg Config, lc *server.Lifecycle) (*redis.ClusterClient, *pgxpool.Pool, error) {
	rdb, err := redisconn.New(ctx, cfg.Redis)
	if err != nil {
		return nil, nil, err
	}
	lc.OwnCloser("redis", rdb)
	if h.redisHook != nil {
		rdb.AddHook(h.redisHook)
	}
	db, err := pgpool.New(ctx, cfg.Postgres)
	if err != nil {
		return nil, nil, err
	}
	if h.pgTracer != nil {
		pc := db.Config()
		pc.ConnConfig.Tracer = h.pgTracer
		db.Close()
		if db, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return nil, nil, fmt.Errorf("postgres: %w", err)
		}
	}
	lc.Own("postgres", func(context.Context) error { db.Close(); return nil })
	return rdb, db, nil
}

// handlerDeps dials the limiter and starts what the handler works with: the
// lookup path, the click pipeline and the visit counter.
func (h hooks) handlerDeps(ctx context.Context, cfg Config, rdb *redis.ClusterClient, db *pgxpool.Pool, srv *server.Server, lc *server.Lifecycle, log *slog.Logger, meter metric.Meter) (deps redirector.Deps, err error) {
	deps.Log = log
	if deps.Quota, deps.PasswordQuota, err = dialLimiter(cfg, srv, lc, log); err != nil {
		return deps, err
	}
	if deps.Resolver, err = h.startResolver(ctx, cfg, rdb, db, lc, log, meter); err != nil {
		return deps, err
	}
	if deps.Clicks, err = h.startClicks(ctx, cfg, lc, log, meter); err != nil {
		return deps, err
	}
	if deps.Visits, err = h.visitCounter(ctx, cfg, lc); err != nil {
		return deps, err
	}
	domains, suspensions := newFreshness(cfg.DomainRefresh), newFreshness(cfg.SuspensionRefresh)
	if err := observeSets(meter, map[string]*freshness{"custom_domains": domains, "tenant_suspensions": suspensions}); err != nil {
		return deps, fmt.Errorf("redirect metrics: %w", err)
	}
	if deps.Hosts, err = startHosts(ctx, cfg, rdb, db, lc, log, domains); err != nil {
		return deps, err
	}
	// Until the domains were read once no host but a default one is
	// served (redirector.Hosts): the replica is not ready to serve them.
	hosts := deps.Hosts
	srv.AddCheck("custom_domains", func(context.Context) error {
		if !hosts.Loaded() {
			return errors.New("the verified custom domains were not read from PostgreSQL yet: only KURZ_REDIRECT_DEFAULT_HOSTS are served")
		}
		return nil
	})
	deps.Suspended = startSuspensions(ctx, cfg, db, lc, log, suspensions)
	// Until the suspended tenants were read once, a suspended tenant's
	// links would redirect here: the replica is not ready, so that a
	// replica started during an abuse does not serve it. A set that
	// stopped refreshing after that keeps the replica ready: PostgreSQL
	// unreachable from every replica at once would otherwise take them all
	// out of rotation, when serving cached links through a PostgreSQL
	// outage is what the redirect promises (and a replica started instead
	// could not read the set either). kurz.redirect.set.age shows it, and
	// KurzRedirectSetStale alerts.
	suspended := deps.Suspended
	srv.AddCheck("tenant_suspensions", func(context.Context) error {
		if !suspended.Loaded() {
			return errors.New("the suspended tenants were not read from PostgreSQL yet (tenant_suspensions: the shortener of this version creates it)")
		}
		return nil
	})
	return deps, nil
}

// maxSuspensionRefresh bounds KURZ_REDIRECT_SUSPENSION_REFRESH: the time a
// suspension may take to stop a tenant's links.
const maxSuspensionRefresh = time.Minute

// maxSuspended bounds the suspended tenants one redirect process holds.
const maxSuspended = 1_000_000

// freshness is when a set the redirect polls from PostgreSQL was last read
// whole. A failed read keeps the set it had, so without it a replica whose
// reads keep failing looks the same as one whose set is current.
type freshness struct {
	refresh time.Duration
	since   time.Time                 // the replica's start: the age until a read succeeds
	last    atomic.Pointer[time.Time] // the start of the last successful read; nil: none yet
}

func newFreshness(refresh time.Duration) *freshness {
	return &freshness{refresh: refresh, since: time.Now()}
}

// read records a successful read that started at start.
func (f *freshness) read(start time.Time) { f.last.Store(&start) }

// age is how old the set in service is: since the start of the last read
// that succeeded, or since the replica started when none did.
func (f *freshness) age() time.Duration {
	if last := f.last.Load(); last != nil {
		return time.Since(*last)
	}
	return time.Since(f.since)
}

// observeSets exports the age of each set and its refresh period, named
// by set (its readiness check's name): a set that stopped refreshing shows
// as an age that grows past its period (KurzRedirectSetStale). The
// attribute sets are built once; the callback runs per scrape only.
func observeSets(meter metric.Meter, sets map[string]*freshness) error {
	age, err := meter.Float64ObservableGauge("kurz.redirect.set.age",
		metric.WithDescription("Time since the last successful read from PostgreSQL of a set the redirect polls (set: custom_domains, tenant_suspensions); a failed read keeps the set it had"),
		metric.WithUnit("s"))
	if err != nil {
		return err
	}
	refresh, err := meter.Float64ObservableGauge("kurz.redirect.set.refresh",
		metric.WithDescription("How often the redirect reads a set from PostgreSQL (KURZ_REDIRECT_DOMAIN_REFRESH, KURZ_REDIRECT_SUSPENSION_REFRESH)"),
		metric.WithUnit("s"))
	if err != nil {
		return err
	}
	type observed struct {
		f    *freshness
		attr metric.ObserveOption
	}
	all := make([]observed, 0, len(sets))
	for name, f := range sets {
		all = append(all, observed{f, metric.WithAttributeSet(attribute.NewSet(attribute.String("set", name)))})
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, s := range all {
			o.ObserveFloat64(age, s.f.age().Seconds(), s.attr)
			o.ObserveFloat64(refresh, s.f.refresh.Seconds(), s.attr)
		}
		return nil
	}, age, refresh)
	return err
}

// startSuspensions loads the suspended tenants from PostgreSQL now and
// every SuspensionRefresh, recording each success in fresh. A failed load
// keeps the set it had and is logged (a database outage does not resume
// anyone, nor suspend anyone);
// until one succeeded none is known (the readiness check says so). No
// change message: the gateway, which writes the table, has no Redis, and
// a read of a small table every two seconds costs less than a
// subscription per replica.
func startSuspensions(ctx context.Context, cfg Config, db *pgxpool.Pool, lc *server.Lifecycle, log *slog.Logger, fresh *freshness) *redirector.Suspended {
	s := &redirector.Suspended{}
	load := func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, cfg.Postgres.QueryTimeout)
		defer cancel()
		start := time.Now()
		tenants, err := suspendedTenants(ctx, db)
		if err != nil {
			log.WarnContext(ctx, "suspended tenants not refreshed", "err", err, "suspended", s.Len(), "loaded", s.Loaded(), "age", fresh.age().Round(time.Second))
			return
		}
		if n := len(tenants); n != s.Len() || !s.Loaded() {
			log.InfoContext(ctx, "suspended tenants", "count", n)
		}
		s.Set(tenants)
		fresh.read(start)
	}
	load(ctx)
	lc.Go("suspended tenants", func(ctx context.Context) {
		reload(ctx, nil, cfg.SuspensionRefresh, cfg.SuspensionRefresh, load)
	})
	return s
}

func suspendedTenants(ctx context.Context, db *pgxpool.Pool) (map[string]struct{}, error) {
	rows, err := db.Query(ctx, `SELECT tenant FROM tenant_suspensions LIMIT $1`, maxSuspended+1)
	if err != nil {
		return nil, fmt.Errorf("suspended tenants: %w", err)
	}
	tenants, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("suspended tenants: %w", err)
	}
	if len(tenants) > maxSuspended {
		return nil, fmt.Errorf("suspended tenants: more than %d, the most a redirect holds", maxSuspended)
	}
	out := make(map[string]struct{}, len(tenants))
	for _, t := range tenants {
		out[t] = struct{}{}
	}
	return out, nil
}

// maxDomains bounds the custom domains one redirect process serves.
const maxDomains = 1_000_000

// domainReloadGap is the shortest time between the end of a read of the
// verified domains and a read a change message triggers (DomainRefresh if
// shorter): each read costs the whole set, and any tenant can make the
// shortener publish changes.
const domainReloadGap = time.Second

// startHosts loads the verified custom domains from PostgreSQL now, every
// DomainRefresh, and whenever the shortener publishes a change (or the
// subscription is re-established, when one may have been missed), at most
// once per domainReloadGap for the changes (reload); each success is
// recorded in fresh. A failed load keeps the set it had and is logged;
// until one succeeded only the default hosts are served (custom domains
// answer 404, and readiness fails).
func startHosts(ctx context.Context, cfg Config, rdb *redis.ClusterClient, db *pgxpool.Pool, lc *server.Lifecycle, log *slog.Logger, fresh *freshness) (*redirector.Hosts, error) {
	hosts := redirector.NewHosts(cfg.DefaultHosts)
	load := func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, cfg.Postgres.QueryTimeout)
		defer cancel()
		start := time.Now()
		domains, err := verifiedDomains(ctx, db)
		if err != nil {
			log.WarnContext(ctx, "custom domains not refreshed", "err", err, "serving", hosts.Domains(), "age", fresh.age().Round(time.Second))
			return
		}
		hosts.SetDomains(domains)
		fresh.read(start)
	}
	sub, err := subscribe(ctx, rdb, linkdomain.ChangedChannel)
	if err != nil {
		return nil, err
	}
	load(ctx)
	lc.Go("custom domains", func(ctx context.Context) {
		defer func() { _ = sub.Close() }()
		reload(ctx, sub.ChannelWithSubscriptions(), cfg.DomainRefresh, min(domainReloadGap, cfg.DomainRefresh), load)
	})
	return hosts, nil
}

// reload calls load every refresh and on each message of changes (nil:
// none, every refresh only), but a message within gap of the end of the
// previous load only makes sure one load follows when gap has passed: a
// burst of messages costs one load per gap, and its last change is always
// read. It returns when ctx ends or changes is closed.
func reload(ctx context.Context, changes <-chan any, refresh, gap time.Duration, load func(context.Context)) {
	tick := time.NewTicker(refresh)
	defer tick.Stop()
	var last time.Time
	var trailing *time.Timer
	var due <-chan time.Time // trailing's, while a load is due
	run := func() {
		if trailing != nil {
			trailing.Stop()
			trailing, due = nil, nil
		}
		load(ctx)
		last = time.Now()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			run()
		case <-due:
			run()
		case _, ok := <-changes:
			switch {
			case !ok:
				return
			case due != nil:
				// The load due reads this change too.
			case time.Since(last) < gap:
				trailing = time.NewTimer(gap - time.Since(last))
				due = trailing.C
			default:
				run()
			}
		}
	}
}

// verifiedDomains reads every verified domain (table domains, owned by the
// shortener: pkg/linkschema) and the tenant that holds it.
func verifiedDomains(ctx context.Context, db *pgxpool.Pool) (map[string]string, error) {
	rows, err := db.Query(ctx, `SELECT name, tenant FROM domains WHERE verified_at IS NOT NULL LIMIT $1`, maxDomains)
	if err != nil {
		return nil, fmt.Errorf("verified domains: %w", err)
	}
	out := map[string]string{}
	for rows.Next() {
		var name, tenant string
		if err := rows.Scan(&name, &tenant); err != nil {
			rows.Close()
			return nil, fmt.Errorf("verified domains: %w", err)
		}
		out[name] = tenant
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("verified domains: %w", err)
	}
	return out, nil
}

// dialLimiter opens one connection to the limiter for two clients: the miss
// path's (short timeout, configurable policy) and the password attempts'
// (fail closed).
func dialLimiter(cfg Config, srv *server.Server, lc *server.Lifecycle, log *slog.Logger) (miss, password *quota.Client, err error) {
	conn, err := grpcclient.Dial(cfg.LimiterAddr, srv.Telemetry)
	if err != nil {
		return nil, nil, fmt.Errorf("limiter (KURZ_LIMITER_GRPC_ADDR): %w", err)
	}
	lc.OwnCloser("limiter connection", conn)
	if miss, err = quota.New(conn, cfg.LimiterTimeout, log, srv.Telemetry.MeterProvider); err != nil {
		return nil, nil, err
	}
	password, err = quota.New(conn, cfg.PasswordLimiterTimeout, log, srv.Telemetry.MeterProvider)
	return miss, password, err
}

// startResolver builds the lookup path (L1, Redis, PostgreSQL) and keeps L1
// current with the invalidations the shortener publishes.
func (h hooks) startResolver(ctx context.Context, cfg Config, rdb *redis.ClusterClient, db *pgxpool.Pool, lc *server.Lifecycle, log *slog.Logger, meter metric.Meter) (*resolve.Resolver, error) {
	resolver, err := resolve.New(resolve.Config{
		L1TTL: cfg.L1TTL, L1Size: cfg.L1Size, L1Bytes: cfg.L1Bytes, Cache: cfg.Cache,
		DBTimeout: cfg.Postgres.QueryTimeout, RedisTimeout: cfg.Redis.ReadTimeout + cfg.Redis.WriteTimeout,
	}, rdb, db, log, meter)
	if err != nil {
		return nil, err
	}
	resolver.BeforeFlight = h.beforeFlight
	resolver.AfterInvalidate = h.afterInvalidate
	sub, err := subscribe(ctx, rdb, linkcache.InvalidationChannel)
	if err != nil {
		return nil, err
	}
	listening := make(chan struct{})
	go func() { resolver.Listen(context.WithoutCancel(ctx), sub); close(listening) }()
	// Closing the subscription ends the listener.
	lc.Own("invalidations", func(context.Context) error { err := sub.Close(); <-listening; return err })
	return resolver, nil
}

// subscribe subscribes to channel (the invalidations', the domain
// changes') and waits for Redis to confirm: messages flow from then on.
func subscribe(ctx context.Context, rdb *redis.ClusterClient, channel string) (*redis.PubSub, error) {
	sub := rdb.Subscribe(ctx, channel)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := sub.Receive(ctx); err != nil {
		_ = sub.Close()
		return nil, fmt.Errorf("redis subscribe %s (KURZ_REDIS_ADDRS): %w", channel, err)
	}
	return sub, nil
}

// startClicks starts the pipeline of click events into the Redis streams.
func (h hooks) startClicks(ctx context.Context, cfg Config, lc *server.Lifecycle, log *slog.Logger, meter metric.Meter) (*clickpipe.Pipeline, error) {
	clickRedis := h.clickRedis
	if clickRedis == nil {
		// The click streams get a client of their own that never retries:
		// XADD is not idempotent, and a retry after a timeout whose write
		// went through would append the click twice. Its sockets wait as
		// long as a batch may take.
		crdb, err := redisconn.New(ctx, cfg.Redis, redisconn.NoRetries, redisconn.SocketTimeouts(cfg.ClickWriteTimeout))
		if err != nil {
			return nil, err
		}
		lc.OwnCloser("click redis", crdb) // closed after the pipeline's last flush
		clickRedis = crdb
	}
	pc := clickpipe.Config{
		Streams: cfg.Streams, Buffer: cfg.ClickBuffer, Batch: cfg.ClickBatch,
		Linger: cfg.ClickFlushInterval, WriteTimeout: cfg.ClickWriteTimeout,
	}
	if c, ok := clickRedis.(*redis.ClusterClient); ok {
		// Each stream writer on a connection of its own to its master,
		// the slot map reloaded when one fails (a failover).
		pc.Route, pc.NodeFailed, pc.DialTimeout = clickpipe.ClusterRoute(c), clickpipe.ClusterReload(c), c.Options().DialTimeout
	}
	clicks, err := clickpipe.New(pc, clickRedis, log, meter)
	if err != nil {
		return nil, err
	}
	lc.Own("click pipeline", clicks.Close)
	return clicks, nil
}

// visitCounter is the client that counts the visits of visit-limited links.
func (h hooks) visitCounter(ctx context.Context, cfg Config, lc *server.Lifecycle) (redis.Cmdable, error) {
	if h.visitRedis != nil {
		return h.visitRedis, nil
	}
	// Visit counters get a client that never retries: an INCR retried
	// after a timeout whose first try went through would spend two visits
	// on one. A failed count refuses the visit instead.
	vrdb, err := redisconn.New(ctx, cfg.Redis, redisconn.NoRetries, redisconn.SocketTimeouts(cfg.VisitTimeout))
	if err != nil {
		return nil, err
	}
	lc.OwnCloser("visit redis", vrdb)
	return vrdb, nil
}

// openGeoIP opens the country database of cfg, if any, and keeps it
// current while lc runs. Without one it returns nil: clicks carry no
// country.
func openGeoIP(cfg geoip.Config, lc *server.Lifecycle, log *slog.Logger) (*geoip.Source, error) {
	if cfg.DB == "" {
		return nil, nil
	}
	src, err := geoip.OpenSource(cfg.DB)
	if err != nil {
		return nil, fmt.Errorf("KURZ_GEOIP_DB: %w", err)
	}
	db := src.DB()
	log.Info("geoip database loaded", "path", cfg.DB, "type", db.Type, "build", db.Built, "reload_interval", cfg.ReloadInterval)
	if cfg.ReloadInterval > 0 {
		lc.Go("geoip reload", func(ctx context.Context) { src.Watch(ctx, cfg.ReloadInterval, log) })
	}
	return src, nil
}

// observeGeoIP exports the age of the GeoIP database in service: its
// licence may require current data, and a reload that keeps failing shows
// as an age that only grows.
func observeGeoIP(meter metric.Meter, geo *geoip.Source) error {
	age, err := meter.Float64ObservableGauge("kurz.redirect.geoip.age",
		metric.WithDescription("Time since the GeoIP database in service was built (its metadata's build epoch)"),
		metric.WithUnit("s"))
	if err != nil {
		return err
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveFloat64(age, time.Since(geo.DB().Built).Seconds())
		return nil
	}, age)
	return err
}

// newHandler builds the HTTP hot path on deps; geo (nil: none) locates
// clicks.
func newHandler(cfg Config, missPolicy quota.Policy, clients *clientip.Policy, geo *geoip.Source, deps redirector.Deps, meter metric.Meter) (*redirector.Handler, error) {
	salt := []byte(cfg.VisitorSalt)
	if len(salt) == 0 {
		salt = []byte(rand.Text())
		deps.Log.Warn("KURZ_REDIRECT_VISITOR_SALT is not set: using a random salt, so each pod hashes visitors and picks A/B-test variants differently")
	}
	formSecret := []byte(cfg.FormSecret)
	if len(formSecret) == 0 {
		formSecret = []byte(rand.Text() + rand.Text())
		deps.Log.Warn("KURZ_REDIRECT_FORM_SECRET is not set: using a random secret, so a password form only verifies on the pod that rendered it")
	}
	hcfg := redirector.Config{
		DefaultStatus: cfg.DefaultStatus, CDNMaxAge: cfg.CDNMaxAge, PermanentMaxAge: cfg.PermanentMaxAge, HomeURL: cfg.HomeURL,
		Clients: clients, Keying: cfg.Keying, VisitorSalt: salt, MissPolicy: missPolicy,
		FormSecret: formSecret, VisitTimeout: cfg.VisitTimeout, VisitReplicas: cfg.VisitReplicas,
		WalkRate: cfg.WalkRate, WalkBurst: cfg.WalkBurst, PasswordChecks: cfg.PasswordChecks,
	}
	if geo != nil {
		hcfg.Country = geo.Country
	}
	return redirector.New(hcfg, deps, meter)
}
