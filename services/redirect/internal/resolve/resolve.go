// Package resolve answers "what does this code lead to?" for the redirect
// service, cheapest first: an in-process L1 cache (a few seconds), then the
// shared Redis entry (key l:<code>), then PostgreSQL. Concurrent misses on one
// code collapse into a single lookup, so a viral code that drops out of every
// cache costs one Redis read and at most one PostgreSQL query per pod.
//
// L1 admits only entries read from Redis: the first request after a cache
// flush is answered from PostgreSQL (X-Source: db) and fills Redis, the next
// from Redis (cache), which fills L1 (l1). One-hit codes, such as a scanner's
// guesses, never take L1 space.
package resolve

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/sync/singleflight"

	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkrules"
	"kurz.dev/pkg/logging"
)

// Source says which tier answered.
type Source string

// The tiers, as the X-Source header names them.
const (
	SourceL1    Source = "l1"
	SourceCache Source = "cache"
	SourceDB    Source = "db"
)

// Result is a code's entry and where it came from.
type Result struct {
	Entry  linkcache.Entry
	Source Source
}

// Tier is the lookup a Gate is asked about.
type Tier int

const (
	// TierCache: the request missed L1 and is about to read Redis (or join
	// a lookup that does). Asked once per such request.
	TierCache Tier = iota
	// TierDB: the code is in no cache; the lookup is about to query
	// PostgreSQL. Asked by the request that leads the lookup.
	TierDB
)

// Gate is asked before each lookup past L1, with its tier: the redirect
// service puts its per-IP walk bound at TierCache and the per-IP limiter at
// TierDB. L1 hits never ask. A non-nil error stops the lookup and is
// returned to the caller.
type Gate func(ctx context.Context, tier Tier) error

// Config sizes the resolver.
type Config struct {
	L1TTL  time.Duration
	L1Size int
	// L1Bytes bounds L1 by weight as well as by entries (see weight). An
	// entry over L1Bytes/64 is not kept at all. Zero: no bound by weight.
	L1Bytes int64
	Cache   linkcache.Config
	// DBTimeout bounds the PostgreSQL query; RedisTimeout the Redis read and
	// fill.
	DBTimeout    time.Duration
	RedisTimeout time.Duration
}

// Querier is the PostgreSQL call the resolver makes: a *pgxpool.Pool, or a
// fake in tests.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Resolver is safe for concurrent use.
type Resolver struct {
	cfg     Config
	rdb     redis.Cmdable
	db      Querier
	log     *slog.Logger
	l1      *expirable.LRU[string, l1Entry]
	l1Bytes atomic.Int64 // the weight of what l1 holds
	flights singleflight.Group
	// gens has one counter per stripe of codes, bumped by every invalidation:
	// a lookup that started before an invalidation of its code does not
	// admit its (possibly stale) answer to L1.
	gens [256]atomic.Uint64
	seed maphash.Seed

	// BeforeFlight, if set, runs when a request misses L1 and is about to
	// join or lead a lookup (tests use it to release requests together).
	BeforeFlight func(code string)
	// AfterInvalidate, if set, runs after an invalidation of code was
	// applied (tests use it to wait for the shortener's Pub/Sub message).
	AfterInvalidate func(code string)

	collapsed   metric.Int64Counter
	redisErrors metric.Int64Counter
	invalidated metric.Int64Counter

	// dbLogs and redisLogs let one line a second through about failed
	// PostgreSQL lookups and failed Redis reads and fills: an outage
	// under load fails thousands a second.
	dbLogs, redisLogs logging.Every
}

// New returns a resolver over rdb and db.
func New(cfg Config, rdb redis.Cmdable, db Querier, log *slog.Logger, meter metric.Meter) (*Resolver, error) {
	r := &Resolver{cfg: cfg, rdb: rdb, db: db, log: log, seed: maphash.MakeSeed()}
	r.l1 = expirable.NewLRU(cfg.L1Size, func(_ string, v l1Entry) { r.l1Bytes.Add(-v.weight) }, cfg.L1TTL)
	var errs []error
	counter := func(name, desc, unit string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return c
	}
	r.collapsed = counter("kurz.redirect.lookups.collapsed",
		"Requests that missed L1 and shared another request's lookup instead of reading Redis themselves", "{request}")
	r.redisErrors = counter("kurz.redirect.cache.errors",
		"Redis reads or fills of link entries that failed (the request fell through to PostgreSQL)", "{error}")
	r.invalidated = counter("kurz.redirect.l1.invalidations",
		"L1 invalidations received from the shortener (code) or forced by a Pub/Sub reconnect (purge)", "{invalidation}")
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("resolver metrics: %w", err)
	}
	return r, nil
}

type flightResult struct {
	res Result
	err error
}

// Resolve returns code's entry. On an L1 miss gate runs with TierCache, and
// again with TierDB if this request leads a lookup that must go to
// PostgreSQL. If another request's gate refused a lookup this request had
// joined, this request looks up on its own (its own gate), so one client's
// denial never spreads to others.
func (r *Resolver) Resolve(ctx context.Context, code string, gate Gate) (Result, error) {
	if v, ok := r.l1.Get(code); ok {
		return Result{Entry: v.e, Source: SourceL1}, nil
	}
	if gate != nil {
		if err := gate(ctx, TierCache); err != nil {
			return Result{}, err
		}
	}
	if r.BeforeFlight != nil {
		r.BeforeFlight(code)
	}
	for attempt := 0; ; attempt++ {
		led := false
		v, _, shared := r.flights.Do(code, func() (any, error) {
			led = true
			res, err := r.lookup(ctx, code, gate)
			return flightResult{res, err}, nil
		})
		fr := v.(flightResult)
		// shared is true for the leader too when others joined: only the
		// requests that joined were collapsed.
		if shared && !led {
			r.collapsed.Add(ctx, 1)
			var denied *Denied
			if errors.As(fr.err, &denied) && attempt < 2 {
				continue
			}
		}
		return fr.res, fr.err
	}
}

// lookup reads Redis, then PostgreSQL; it runs once per flight, on behalf of
// every request that joined it, so it does not stop when the leading
// request's client goes away.
func (r *Resolver) lookup(reqCtx context.Context, code string, gate Gate) (Result, error) {
	ctx := context.WithoutCancel(reqCtx)
	gen := r.gen(code)

	rctx, cancel := context.WithTimeout(ctx, r.cfg.RedisTimeout)
	c, err := linkcache.Read(rctx, r.rdb, code)
	cancel()
	e, size, found := c.Entry, c.Size, c.Found
	redisOK := err == nil
	if err != nil {
		r.redisErrors.Add(ctx, 1, metric.WithAttributes(attribute.String("op", "get")))
		if n, ok := r.redisLogs.Allow(); ok {
			r.log.WarnContext(ctx, "redis read failed; asking PostgreSQL", "code", code, "failures_not_logged", n, "err", err)
		}
	}
	if found {
		if r.gen(code) == gen {
			r.admit(code, e, size)
		}
		return Result{Entry: e, Source: SourceCache}, nil
	}

	if gate != nil {
		if err := gate(reqCtx, TierDB); err != nil {
			return Result{}, err
		}
	}
	e, err = r.fromDB(ctx, code)
	if err != nil {
		r.dbFailed(ctx, code, err)
		return Result{}, err
	}
	if redisOK {
		ttl := r.cfg.Cache.TTL
		if e.State == linkcache.Missing {
			ttl = r.cfg.Cache.NegativeTTL
		}
		fctx, cancel := context.WithTimeout(ctx, r.cfg.RedisTimeout)
		if err := linkcache.Fill(fctx, r.rdb, code, e, ttl, c.Stale); err != nil {
			r.redisErrors.Add(ctx, 1, metric.WithAttributes(attribute.String("op", "fill")))
			if n, ok := r.redisLogs.Allow(); ok {
				r.log.WarnContext(ctx, "redis fill failed", "code", code, "failures_not_logged", n, "err", err)
			}
		}
		cancel()
	}
	return Result{Entry: e, Source: SourceDB}, nil
}

// dbFailed logs a PostgreSQL lookup that failed (the request is answered
// 503), at most once a second with the number of failures left out since
// the last line. A schema older than this build (a column or table it
// reads is missing: the shortener, which migrates, was not upgraded first)
// says so.
func (r *Resolver) dbFailed(ctx context.Context, code string, err error) {
	n, ok := r.dbLogs.Allow()
	if !ok {
		return
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42703" || pgErr.Code == "42P01") { // undefined_column, undefined_table
		r.log.ErrorContext(ctx, "postgres lookup failed: the links schema is older than this redirect; "+
			"upgrade the shortener first (it applies the migrations)", "code", code, "failures_not_logged", n, "err", err)
		return
	}
	r.log.WarnContext(ctx, "postgres lookup failed; answering 503", "code", code, "failures_not_logged", n, "err", err)
}

func (r *Resolver) fromDB(ctx context.Context, code string) (linkcache.Entry, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.DBTimeout)
	defer cancel()
	var (
		e                     linkcache.Entry
		status                int16
		expires               *time.Time
		disabled, deleted     bool
		hash                  *string
		ios, android, desktop *string
		rules                 []byte
	)
	err := r.db.QueryRow(ctx, `SELECT tenant, long_url, redirect_type, expires_at, disabled, deleted_at IS NOT NULL,
			max_visits, password_hash, ios_url, android_url, desktop_url, rules
		FROM links WHERE code = $1`, code).Scan(&e.Tenant, &e.URL, &status, &expires, &disabled, &deleted,
		&e.MaxVisits, &hash, &ios, &android, &desktop, &rules)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return linkcache.Entry{State: linkcache.Missing}, nil
	case err != nil:
		return linkcache.Entry{}, fmt.Errorf("postgres lookup of %s: %w", code, err)
	case deleted || disabled:
		return linkcache.Entry{State: linkcache.Gone, Tenant: e.Tenant}, nil
	}
	e.State = linkcache.Active
	e.Status = int(status)
	if expires != nil {
		e.ExpiresAtMs = expires.UnixMilli()
	}
	if hash != nil {
		e.PasswordHash = *hash
	}
	if t := (linkcache.Targets{IOS: deref(ios), Android: deref(android), Desktop: deref(desktop)}); t != (linkcache.Targets{}) {
		e.Targets = &t
	}
	if e.Rules, err = linkrules.Parse(rules); err != nil {
		return linkcache.Entry{}, fmt.Errorf("postgres lookup of %s: rules: %w", code, err)
	}
	return e, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func (r *Resolver) stripe(code string) *atomic.Uint64 {
	return &r.gens[maphash.String(r.seed, code)%uint64(len(r.gens))]
}

func (r *Resolver) gen(code string) uint64 { return r.stripe(code).Load() }

// l1Entry is an L1 entry and its weight.
type l1Entry struct {
	e      linkcache.Entry
	weight int64
}

// An L1 entry's weight, its heap estimated from above: l1Overhead (the
// entry, its list element and map slot), l1PerByte per byte of its Redis
// encoding (its strings), and for its rules l1PerCondition per condition
// and l1PerValue per value, what a compiled condition and each further
// value take (measured: 64 one-value conditions ~19-22 KiB, of 32 CIDRs
// each ~157 KiB, where the encoding is 1.3-3.2 and 32 KiB).
const (
	l1Overhead     = 512
	l1PerByte      = 2
	l1PerCondition = 320
	l1PerValue     = 72
)

func weight(e linkcache.Entry, size int) int64 {
	conditions, values := e.Rules.Size()
	return l1Overhead + l1PerByte*int64(size) + l1PerCondition*int64(conditions) + l1PerValue*int64(values)
}

// admit keeps e, whose Redis encoding is size bytes long, in L1, then
// evicts the least recently used entries while L1 weighs more than
// L1Bytes. Links of a stranger's making may be large (many rules, long
// destinations): by entries alone L1 could outgrow the process.
func (r *Resolver) admit(code string, e linkcache.Entry, size int) {
	// Whatever version L1 holds goes first: Add over an entry would not
	// give its weight back, and a lighter one must not outlive a change.
	r.l1.Remove(code)
	w := weight(e, size)
	if r.cfg.L1Bytes > 0 && w > r.cfg.L1Bytes/64 {
		return
	}
	r.l1Bytes.Add(w)
	r.l1.Add(code, l1Entry{e: e, weight: w})
	for r.cfg.L1Bytes > 0 && r.l1Bytes.Load() > r.cfg.L1Bytes {
		if _, _, ok := r.l1.RemoveOldest(); !ok {
			break
		}
	}
}

// Invalidate drops code from L1 (the shortener changed it).
func (r *Resolver) Invalidate(code string) {
	r.stripe(code).Add(1)
	r.l1.Remove(code)
	r.invalidated.Add(context.Background(), 1, metric.WithAttributes(attribute.String("kind", "code")))
	if r.AfterInvalidate != nil {
		r.AfterInvalidate(code)
	}
}

// Purge empties L1; after a Pub/Sub reconnect invalidations may have been
// missed.
func (r *Resolver) Purge() {
	for i := range r.gens {
		r.gens[i].Add(1)
	}
	r.l1.Purge()
	r.invalidated.Add(context.Background(), 1, metric.WithAttributes(attribute.String("kind", "purge")))
}

// Listen applies the shortener's invalidations until sub is closed. Call it
// after the subscription was confirmed (sub.Receive). Pub/Sub keeps nothing
// for a disconnected subscriber, so every re-subscription purges L1: what was
// missed is dropped too.
func (r *Resolver) Listen(ctx context.Context, sub *redis.PubSub) {
	for msg := range sub.ChannelWithSubscriptions(redis.WithChannelSize(1024)) {
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				r.log.WarnContext(ctx, "invalidation channel re-subscribed; purging L1")
				r.Purge()
			}
		case *redis.Message:
			r.Invalidate(m.Payload)
		}
	}
}

// Denied is a Gate's refusal: the limiter said no (or, fail-closed, could not
// say).
type Denied struct {
	RetryAfter time.Duration
	// Unavailable: the limiter did not answer and the policy is fail-closed.
	Unavailable bool
}

func (d *Denied) Error() string {
	if d.Unavailable {
		return "miss path closed: limiter unavailable"
	}
	return fmt.Sprintf("miss path rate limited; retry after %v", d.RetryAfter)
}
