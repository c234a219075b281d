// Package app wires the shortener service: PostgreSQL (with the links schema
// migrations), Redis Cluster for write-through, the limiter, and
// kurz.shortener.v1.ShortenerService on the gRPC server.
package app

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/capacity"
	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/pkg/linkschema"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/server"
	"kurz.dev/pkg/svcauth"
	"kurz.dev/services/shortener/internal/codegen"
	"kurz.dev/services/shortener/internal/linkapi"
	"kurz.dev/services/shortener/internal/linkstore"
	"kurz.dev/services/shortener/internal/urlcheck"
	"kurz.dev/services/shortener/internal/webhook"
)

// Config is the shortener's configuration, from KURZ_* environment variables.
type Config struct {
	server.Common
	// GRPCAddr is the shortener's gRPC address: where it listens, and where its callers dial it.
	GRPCAddr string `env:"SHORTENER_GRPC_ADDR" default:"127.0.0.1:9092"`
	// HTTPAddr is the shortener's ops HTTP address (/healthz, /readyz, /metrics).
	HTTPAddr string `env:"SHORTENER_HTTP_ADDR" default:"127.0.0.1:9192"`
	Postgres pgpool.Config
	Redis    redisconn.Config
	Cache    linkcache.Config
	// Keying keys the quota's client IPs (KURZ_CLIENT_IPV6_PREFIX): the
	// same prefix as the gateway's.
	Keying clientip.Keying
	// ServiceAuth verifies the callers' signed tenant assertions: a call
	// without a valid one is refused, whatever tenant its metadata names.
	ServiceAuth svcauth.Config

	// LimiterAddr is where the limiter's gRPC listens.
	LimiterAddr string `env:"LIMITER_GRPC_ADDR" default:"127.0.0.1:9091"`
	// LimiterTimeout bounds one CheckQuota.
	LimiterTimeout time.Duration `env:"SHORTENER_LIMITER_TIMEOUT" default:"50ms"`
	// LimiterFailurePolicy is what link creation does when the limiter does
	// not answer in time: open (allow, logged and counted) or closed.
	LimiterFailurePolicy string `env:"SHORTENER_LIMITER_FAILURE_POLICY" default:"open"`

	// BaseURL prefixes short URLs; its host is also refused as a target.
	BaseURL string `env:"SHORTENER_BASE_URL" default:"http://127.0.0.1:8787"`
	// OwnHosts are further hosts that serve kurz short links (refused as
	// targets: redirect loops). Every name of KURZ_REDIRECT_DEFAULT_HOSTS
	// but the base URL's host belongs here too.
	OwnHosts []string `env:"SHORTENER_OWN_HOSTS" default:""`
	// AllowAnonymous lets calls without x-kurz-tenant create and manage the
	// links of tenant "anonymous".
	AllowAnonymous bool `env:"SHORTENER_ALLOW_ANONYMOUS" default:"false"`
	// BlockSize is how many sequential IDs one nextval hands this process.
	// Every replica must use the same value.
	BlockSize int64 `env:"SHORTENER_BLOCK_SIZE" default:"1000"`
	// CodeKey keys the permutation that turns block IDs into codes (so codes
	// cannot be walked), and the hash of codes from the URL. Required, at
	// least 32 characters, the same on every replica and never changed: a
	// new key keeps every link working (a URL's existing link is still
	// found) but makes new codes collide with old ones now and then (each
	// collision costs a skipped ID or candidate).
	CodeKey string `env:"SHORTENER_CODE_KEY" default:""`
	// RandomCodeLength is the length of CODE_MODE_RANDOM codes.
	RandomCodeLength int `env:"SHORTENER_RANDOM_CODE_LENGTH" default:"7"`
	// MaxURLLength bounds long URLs.
	MaxURLLength int `env:"SHORTENER_MAX_URL_LENGTH" default:"2048"`
	// AllowPrivateHosts accepts targets on loopback, private and link-local
	// IPs and localhost names (development only).
	AllowPrivateHosts bool `env:"SHORTENER_ALLOW_PRIVATE_HOSTS" default:"false"`
	// BlocklistFile lists blocked domains, one per line; empty: none.
	BlocklistFile string `env:"SHORTENER_BLOCKLIST_FILE" default:""`
	// BlocklistReload is how often the blocklist file is checked for
	// changes, at least 10ms.
	BlocklistReload time.Duration `env:"SHORTENER_BLOCKLIST_RELOAD" default:"5s"`
	// CacheWriteTimeout bounds the write-through to Redis after a commit.
	CacheWriteTimeout time.Duration `env:"SHORTENER_CACHE_WRITE_TIMEOUT" default:"500ms"`
	// CacheReplicas is how many Redis replicas must hold a changed link's
	// entry (WAIT, within KURZ_SHORTENER_CACHE_WRITE_TIMEOUT) before the
	// change's queued invalidation is done; until then it is retried. A
	// failover to a replica without the entry would otherwise bring back
	// the link's previous state: a takedown undone for the cache TTL. 0
	// for a Redis without replicas; no more than every master has.
	CacheReplicas int `env:"SHORTENER_CACHE_REPLICAS" default:"1"`
	// InvalidationRetry is how often queued invalidations (write-throughs of
	// changed links that failed) are retried, and the first backoff; at
	// least 10ms.
	InvalidationRetry time.Duration `env:"SHORTENER_INVALIDATION_RETRY" default:"1s"`
	// InvalidationMaxBackoff bounds the backoff, doubled per failure.
	InvalidationMaxBackoff time.Duration `env:"SHORTENER_INVALIDATION_MAX_BACKOFF" default:"10s"`
	// MaxConcurrentHashes bounds the password hashes (Argon2id, 19 MiB of
	// memory each) the process runs at once, over creates, batches and
	// updates together: size it to the memory limit (4: 76 MiB).
	MaxConcurrentHashes int `env:"SHORTENER_MAX_CONCURRENT_HASHES" default:"4"`
	// Webhooks are the tenants' webhook subscriptions and their sender.
	Webhooks webhook.Config
	// HashWait is how long a call waits for a hashing slot before it is
	// refused UNAVAILABLE (at most MaxConcurrentHashes calls wait).
	HashWait time.Duration `env:"SHORTENER_HASH_WAIT" default:"250ms"`
	// MaxDomains bounds the custom domains one tenant may register.
	MaxDomains int `env:"SHORTENER_MAX_DOMAINS" default:"20"`
	// DNSServer is the DNS server (host:port) VerifyDomain asks for the
	// _kurz-challenge TXT records; empty: the system's resolver.
	DNSServer string `env:"SHORTENER_DNS_SERVER" default:""`
	// DNSTimeout bounds one TXT lookup of VerifyDomain, and so does the
	// call's own deadline less a moment to answer: well under the
	// gateway's KURZ_GATEWAY_CALL_TIMEOUT (5s), so that a slow DNS server
	// is DNS_UNAVAILABLE rather than the gateway's DEADLINE_EXCEEDED.
	DNSTimeout time.Duration `env:"SHORTENER_DNS_TIMEOUT" default:"3s"`
	// TXT is for tests: when set, VerifyDomain asks it instead of DNS. It
	// has no env tag, so no environment variable can set it.
	TXT linkapi.TXTResolver
}

// Check runs validate for server.Main, before the service starts.
func (c Config) Check() error {
	_, _, _, err := c.validate()
	return errors.Join(err, c.Redis.Check(), c.Postgres.Check())
}

func (c Config) validate() (quota.Policy, urlcheck.Policy, *svcauth.Keys, error) {
	keys, err := c.ServiceAuth.Keys()
	errs := []error{err}
	policy, err := quota.ParsePolicy(c.LimiterFailurePolicy)
	if err != nil {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_LIMITER_FAILURE_POLICY: %w", err))
	}
	if c.BlockSize < 1 || c.BlockSize > 1_000_000 {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_BLOCK_SIZE=%d: want 1 to 1000000", c.BlockSize))
	}
	if n := len(c.CodeKey); n < linkcode.MinKeyLength {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_CODE_KEY has %d characters: want at least %d random ones, the same on every replica (e.g. openssl rand -hex 32)", n, linkcode.MinKeyLength))
	}
	errs = append(errs, config.NotPublished("KURZ_SHORTENER_CODE_KEY", c.CodeKey, c.ServiceAuth.AllowPublishedSecrets))
	if c.RandomCodeLength < linkcode.MinLength || c.RandomCodeLength > 16 {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_RANDOM_CODE_LENGTH=%d: want %d to 16", c.RandomCodeLength, linkcode.MinLength))
	}
	if c.MaxURLLength < 32 || c.MaxURLLength > 65536 {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_MAX_URL_LENGTH=%d: want 32 to 65536", c.MaxURLLength))
	}
	errs = append(errs, config.Period("KURZ_SHORTENER_BLOCKLIST_RELOAD", c.BlocklistReload, 10*time.Millisecond))
	if c.MaxConcurrentHashes < 1 || c.MaxConcurrentHashes > 256 {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_MAX_CONCURRENT_HASHES=%d: want 1 to 256", c.MaxConcurrentHashes))
	}
	if c.HashWait < 0 || c.HashWait > 10*time.Second {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_HASH_WAIT=%s: want 0 to 10s", c.HashWait))
	}
	if c.CacheWriteTimeout <= 0 || c.LimiterTimeout <= 0 {
		errs = append(errs, errors.New("KURZ_SHORTENER_CACHE_WRITE_TIMEOUT and KURZ_SHORTENER_LIMITER_TIMEOUT must be positive"))
	}
	if c.CacheReplicas < 0 {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_CACHE_REPLICAS=%d: want 0 or more", c.CacheReplicas))
	}
	if c.MaxDomains < 0 || c.MaxDomains > 10_000 {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_MAX_DOMAINS=%d: want 0 to 10000", c.MaxDomains))
	}
	if c.DNSTimeout <= 0 {
		errs = append(errs, errors.New("KURZ_SHORTENER_DNS_TIMEOUT must be positive"))
	}
	if c.DNSServer != "" {
		if _, _, err := net.SplitHostPort(c.DNSServer); err != nil {
			errs = append(errs, fmt.Errorf("KURZ_SHORTENER_DNS_SERVER=%q: want host:port, e.g. 127.0.0.1:53", c.DNSServer))
		}
	}
	errs = append(errs, config.Period("KURZ_SHORTENER_INVALIDATION_RETRY", c.InvalidationRetry, 10*time.Millisecond))
	if c.InvalidationMaxBackoff < c.InvalidationRetry {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_INVALIDATION_MAX_BACKOFF=%s: want at least KURZ_SHORTENER_INVALIDATION_RETRY=%s", c.InvalidationMaxBackoff, c.InvalidationRetry))
	}
	_, werr := c.Webhooks.Validate()
	errs = append(errs, c.Cache.Validate(), c.Keying.Check(), werr)
	up := urlcheck.Policy{MaxLength: c.MaxURLLength, AllowPrivateHosts: c.AllowPrivateHosts}
	if u, err := url.Parse(c.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_BASE_URL=%q: want an http(s) URL such as https://kurz.example", c.BaseURL))
	}
	for _, h := range append([]string{c.BaseURL}, c.OwnHosts...) {
		own, err := urlcheck.OwnHost(h)
		if err != nil {
			errs = append(errs, fmt.Errorf("KURZ_SHORTENER_BASE_URL / KURZ_SHORTENER_OWN_HOSTS: %q is not a host: %w", h, err))
			continue
		}
		up.OwnHosts = append(up.OwnHosts, own)
	}
	return policy, up, keys, errors.Join(errs...)
}

// Build wires the shortener within lc: PostgreSQL (migrated), Redis and the
// blocklist, then its server, the limiter client and the link service with
// its background work. The main passes it to server.Main.
func Build(ctx context.Context, cfg Config, lc *server.Lifecycle, log *slog.Logger) (*server.Server, error) {
	return hooks{}.wire(ctx, cfg, lc, log)
}

// New starts the shortener in process, as server.Main does before Run.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*server.Server, error) {
	return server.Start(ctx, cfg, log, Build)
}

// build is New with test hooks.
func build(ctx context.Context, cfg Config, log *slog.Logger, h hooks) (*server.Server, error) {
	return server.Start(ctx, cfg, log, h.wire)
}

// hooks let in-package tests observe and steer I/O; zero values are no-ops.
type hooks struct {
	// pgTracer traces every PostgreSQL statement of the service's pool.
	pgTracer pgx.QueryTracer
	// random replaces crypto/rand as the source of random codes.
	random io.Reader
	// hashes replaces the password hashing gate the configuration sizes.
	hashes *capacity.Gate
}

// wire is Build with test hooks.
func (h hooks) wire(ctx context.Context, cfg Config, lc *server.Lifecycle, log *slog.Logger) (*server.Server, error) {
	limiterPolicy, urlPolicy, keys, err := cfg.validate()
	if err != nil {
		return nil, fmt.Errorf("configuration:\n%w", err)
	}
	db, rdb, err := h.openStores(ctx, cfg, lc, log)
	if err != nil {
		return nil, err
	}
	blocklist, err := loadBlocklist(cfg, log)
	if err != nil {
		return nil, err
	}
	srvCfg := cfg.Config(cfg.GRPCAddr, cfg.HTTPAddr)
	// A call without a valid assertion is refused when its headers arrive,
	// before any of its request (up to 4 MiB) is read.
	srvCfg.GRPCAuthenticate = keys.Tap
	srv, err := server.New(ctx, "shortener", srvCfg, lc, log, keys.ServerOptions()...)
	if err != nil {
		return nil, err
	}
	quotaClient, closeLimiter, err := quota.Dial(cfg.LimiterAddr, srv.Telemetry, cfg.LimiterTimeout, log)
	if err != nil {
		return nil, err
	}
	lc.Own("limiter connection", func(context.Context) error { return closeLimiter() })
	deps := linkapi.Deps{Redis: rdb, Policy: urlPolicy, Scanner: urlcheck.Nothing{}, Quota: quotaClient, Log: log}
	if blocklist != nil {
		deps.Scanner = blocklist
	}
	svc, err := h.newLinkService(cfg, limiterPolicy, urlPolicy, db, deps, srv.Telemetry.MeterProvider.Meter("kurz.dev/services/shortener"))
	if err != nil {
		return nil, err
	}
	if err := wireWebhooks(cfg, db, rdb, srv, lc, log); err != nil {
		return nil, err
	}
	startBackground(svc, blocklist, lc, log)
	srv.AddCheck("postgres", db.Ping)
	// Links are written to PostgreSQL; the write-through to Redis is retried
	// (changes) or filled by readers (new links), so Redis is not required.
	srv.AddSoftCheck("redis", func(ctx context.Context) error { return redisconn.Check(ctx, rdb) })
	if cfg.CacheReplicas > 0 {
		// Fewer replicas than WAIT asks for keeps every change of a link
		// on those masters queued: redirects serve its previous state.
		srv.AddSoftCheck("redis_replicas", redisconn.WarnReplicasHeld(ctx, log, rdb, "KURZ_SHORTENER_CACHE_REPLICAS", cfg.CacheReplicas,
			"changes of links there (takedowns too) stay queued and redirects serve the links' previous state",
			"changes of links may never reach the redirects"))
	}
	shortenerv1.RegisterShortenerServiceServer(srv, svc)
	log.Info("shortener configured", "base_url", cfg.BaseURL, "anonymous", cfg.AllowAnonymous,
		"block_size", cfg.BlockSize, "limiter", cfg.LimiterAddr, "limiter_failure_policy", limiterPolicy.String(),
		"max_concurrent_hashes", cfg.MaxConcurrentHashes)
	return srv, nil
}

// openStores connects to PostgreSQL, applying the links schema's
// migrations, and to Redis Cluster.
func (h hooks) openStores(ctx context.Context, cfg Config, lc *server.Lifecycle, log *slog.Logger) (*pgxpool.Pool, *redis.ClusterClient, error) {
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
	applied, err := linkschema.Apply(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	if len(applied) > 0 {
		log.Info("migrations applied", "names", applied)
	}
	if err := linkschema.GrantReader(ctx, db); err != nil {
		return nil, nil, err
	}
	rdb, err := redisconn.New(ctx, cfg.Redis)
	if err != nil {
		return nil, nil, err
	}
	lc.OwnCloser("redis", rdb)
	return db, rdb, nil
}

// loadBlocklist reads the blocklist file; nil when none is configured.
func loadBlocklist(cfg Config, log *slog.Logger) (*urlcheck.Blocklist, error) {
	if cfg.BlocklistFile == "" {
		return nil, nil
	}
	bl, err := urlcheck.NewBlocklist(cfg.BlocklistFile, cfg.BlocklistReload, log)
	if err != nil {
		return nil, err
	}
	log.Info("blocklist loaded", "path", cfg.BlocklistFile, "entries", bl.Len())
	return bl, nil
}

// newLinkService builds the ShortenerService on db and deps (which it
// completes): the store, the code sources and the password hashing gate.
func (h hooks) newLinkService(cfg Config, limiterPolicy quota.Policy, urlPolicy urlcheck.Policy, db *pgxpool.Pool, deps linkapi.Deps, meter metric.Meter) (*linkapi.Service, error) {
	blocksFetched, err := meter.Int64Counter("kurz.shortener.code_blocks.fetched",
		metric.WithDescription("Blocks of sequential IDs taken from the link_block sequence (one nextval each; a batch fetches all it needs in one round trip)"),
		metric.WithUnit("{block}"))
	if err != nil {
		return nil, fmt.Errorf("shortener metrics: %w", err)
	}
	codes, err := linkcode.NewPermutation([]byte(cfg.CodeKey))
	if err != nil {
		return nil, err
	}
	store := linkstore.New(db, cfg.Postgres.QueryTimeout)
	deps.Store = store
	deps.Blocks = codegen.NewBlocks(store.NextBlocks, cfg.BlockSize, codes, func() { blocksFetched.Add(context.Background(), 1) })
	deps.Random = codegen.NewRandom(h.random, cfg.RandomCodeLength)
	if deps.FromURL, err = codegen.NewFromURL([]byte(cfg.CodeKey)); err != nil {
		return nil, err
	}
	deps.Hashes = h.hashes
	if deps.Hashes == nil {
		deps.Hashes = capacity.New(cfg.MaxConcurrentHashes, cfg.HashWait)
	}
	deps.Meter = meter
	deps.Domains = store
	deps.TXT = txtResolver(cfg)
	return linkapi.New(linkapi.Options{
		MaxDomains:     cfg.MaxDomains,
		OwnHosts:       urlPolicy.OwnHosts,
		DNSTimeout:     cfg.DNSTimeout,
		BaseURL:        cfg.BaseURL,
		AllowAnonymous: cfg.AllowAnonymous,
		CacheTTL:       cfg.Cache.TTL,
		CacheTimeout:   cfg.CacheWriteTimeout,
		CacheReplicas:  cfg.CacheReplicas,
		LimiterPolicy:  limiterPolicy,
		RetryInterval:  cfg.InvalidationRetry,
		RetryMaxDelay:  cfg.InvalidationMaxBackoff,
		Keying:         cfg.Keying,
		ETagKey:        etagKey(cfg.CodeKey),
	}, deps)
}

// etagKey is the links' entity tag key, derived from the code key: the
// same on every replica, and no further secret for an operator to keep.
func etagKey(codeKey string) []byte {
	mac := hmac.New(sha256.New, []byte(codeKey))
	mac.Write([]byte("kurz link etags, v1"))
	return mac.Sum(nil)
}

// txtResolver is what VerifyDomain asks: the test's, the configured DNS
// server, or the system's resolver.
func txtResolver(cfg Config) linkapi.TXTResolver {
	switch {
	case cfg.TXT != nil:
		return cfg.TXT
	case cfg.DNSServer != "":
		server := cfg.DNSServer
		return serverResolver{server: server, r: &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, server)
		}}}
	}
	return net.DefaultResolver
}

// serverResolver asks r, whose Dial goes to server whatever address the
// resolver dials: its errors name server, not resolv.conf's, which the
// resolver would name (and the log of a failed lookup with it).
type serverResolver struct {
	server string
	r      *net.Resolver
}

func (s serverResolver) LookupTXT(ctx context.Context, name string) ([]string, error) {
	values, err := s.r.LookupTXT(ctx, name)
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		dnsErr.Server = s.server
	}
	return values, err
}

// startBackground starts the retries of failed write-throughs and, with a
// blocklist, its reloads and sweeps; they stop before the stores close.
func startBackground(svc *linkapi.Service, blocklist *urlcheck.Blocklist, lc *server.Lifecycle, log *slog.Logger) {
	lc.Go("invalidation retries", svc.RunInvalidations)
	if blocklist != nil {
		lc.Go("blocklist", func(ctx context.Context) { blocklist.Run(ctx, func(ctx context.Context) { sweep(ctx, svc, log) }) })
	}
}

// sweep disables the existing links the blocklist now covers and reports
// what it did; a failed sweep runs again at the blocklist's next change or
// the next start.
func sweep(ctx context.Context, svc *linkapi.Service, log *slog.Logger) {
	rep, err := svc.SweepBlocked(ctx)
	if err != nil && ctx.Err() == nil {
		log.Error("blocklist sweep failed", "scanned", rep.Scanned, "disabled", len(rep.Disabled), "err", err)
		return
	}
	log.Info("blocklist sweep done", "scanned", rep.Scanned, "disabled", len(rep.Disabled))
}

// wireWebhooks registers kurz.shortener.v1.WebhookService and starts the
// webhook sender and the click batcher (link.clicked), which stop before
// the stores close.
func wireWebhooks(cfg Config, db *pgxpool.Pool, rdb *redis.ClusterClient, srv *server.Server, lc *server.Lifecycle, log *slog.Logger) error {
	allow, err := cfg.Webhooks.Validate()
	if err != nil {
		return err
	}
	derived := "derived from the code key\x00" + cfg.CodeKey
	key, previous := cmp.Or(cfg.Webhooks.Key, derived), cfg.Webhooks.PreviousKey
	if previous == webhook.DerivedKey {
		previous = derived
	}
	sealer, err := webhook.NewSealer(key, previous)
	if err != nil {
		return err
	}
	targets := webhook.Targets{AllowHTTP: cfg.Webhooks.AllowHTTP, Allow: allow}
	store := webhook.NewStore(db, cfg.Postgres.QueryTimeout)
	sender, err := webhook.NewSender(cfg.Webhooks, store, sealer, targets, cfg.BaseURL, log.With("component", "webhooks"),
		srv.Telemetry.MeterProvider.Meter("kurz.dev/services/shortener/webhook"))
	if err != nil {
		return err
	}
	shortenerv1.RegisterWebhookServiceServer(srv, webhook.NewAPI(cfg.Webhooks, store, sealer, targets, cfg.AllowAnonymous, log))
	if cfg.Webhooks.Send {
		lc.Go("webhook sender", sender.Run)
		clicks := webhook.NewClickBatcher(cfg.Webhooks, rdb, store, cfg.Webhooks.Streams, log.With("component", "webhook-clicks"))
		lc.Go("webhook clicks", clicks.Run)
	}
	log.Info("webhooks configured", "send", cfg.Webhooks.Send, "allow_http", cfg.Webhooks.AllowHTTP, "allow_cidrs", cfg.Webhooks.AllowCIDRs,
		"concurrency", cfg.Webhooks.Concurrency, "max_attempts", cfg.Webhooks.MaxAttempts, "retry_window", cfg.Webhooks.RetryWindow,
		"dedicated_key", cfg.Webhooks.Key != "", "previous_key", cfg.Webhooks.PreviousKey != "")
	return nil
}
