// Package linkapi serves kurz.shortener.v1.ShortenerService: tenant from the
// call's metadata, URL validation, the limiter, code allocation, PostgreSQL,
// and the write-through to the redirect cache.
package linkapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/callmeta"
	"kurz.dev/pkg/capacity"
	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/pkg/linkdomain"
	"kurz.dev/pkg/linkpass"
	"kurz.dev/pkg/linkrules"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/rpcerr"
	"kurz.dev/services/shortener/internal/codegen"
	"kurz.dev/services/shortener/internal/linkstore"
	"kurz.dev/services/shortener/internal/urlcheck"
)

// Limiter domain and descriptors of link creation (rules live in the limiter).
const (
	QuotaDomain = "links.create"
	// RandomAttempts is how many random codes CreateLink tries: the first
	// plus 5 retries on collision.
	RandomAttempts = 6
	// maxTenantLen bounds the tenant metadata.
	maxTenantLen = 128
	// DefaultPageSize and MaxPageSize bound ListLinks.
	DefaultPageSize = 50
	MaxPageSize     = 1000
	// MaxPageBytes bounds the encoded links of one ListLinks page: a page
	// ends early (with a next page token) rather than pass it. 1,000 links
	// with long URLs and device targets encode to several MiB, past gRPC's
	// default 4 MiB receive limit, and a client that cannot read a page
	// cannot read any after it. A quarter of that limit leaves room for the
	// rest of the response, and one link (URLs up to 64 KiB each) always fits.
	MaxPageBytes = 1 << 20
	// updatable lists the update_mask paths UpdateLink accepts.
	updatable = "long_url, redirect_type, expire_time, disabled, tags, title, max_visits, password, device_targets, rules or variants"
)

// Options are the service's settings.
type Options struct {
	// BaseURL prefixes every short URL: BaseURL + "/" + code.
	BaseURL string
	// AllowAnonymous lets calls without tenant metadata act as tenant
	// "anonymous"; otherwise they are UNAUTHENTICATED.
	AllowAnonymous bool
	// CacheTTL is the TTL of write-through entries.
	CacheTTL time.Duration
	// CacheTimeout bounds the write-through (after the commit).
	CacheTimeout time.Duration
	// CacheReplicas is how many Redis replicas must hold a change's entry
	// before its queued invalidation is done (WAIT, within CacheTimeout):
	// a failover to a replica without it would bring back the link's
	// previous state, a takedown undone. 0 waits for none (a Redis
	// without replicas).
	CacheReplicas int
	// LimiterPolicy applies when the limiter does not answer.
	LimiterPolicy quota.Policy
	// RetryInterval is how often RunInvalidations looks for queued
	// invalidations, and the delay after a first failed attempt.
	RetryInterval time.Duration
	// RetryMaxDelay bounds the delay between attempts (doubled per failure).
	RetryMaxDelay time.Duration
	// Keying turns the caller's client IP (from the gateway) into the key
	// of its quota: an IPv6 client's whole prefix is one client.
	Keying clientip.Keying
	// MaxDomains bounds the custom domains of one tenant.
	MaxDomains int
	// OwnHosts are kurz's own short domains (BaseURL's host among them):
	// no tenant may register one.
	OwnHosts []string
	// DNSTimeout bounds one TXT lookup of VerifyDomain.
	DNSTimeout time.Duration
	// ETagKey keys the links' entity tags (etag.go); the app derives it
	// from the code key, so every replica gives a link the same tag.
	ETagKey []byte
}

// Service implements shortenerv1.ShortenerServiceServer.
type Service struct {
	shortenerv1.UnimplementedShortenerServiceServer
	opts    Options
	store   Store
	rdb     redis.Cmdable
	blocks  *codegen.Blocks
	random  *codegen.Random
	fromURL *codegen.FromURL
	policy  urlcheck.Policy
	scanner urlcheck.Scanner
	quota   *quota.Client
	hashes  *capacity.Gate
	domains DomainStore
	txt     TXTResolver
	etagKey []byte
	log     *slog.Logger
	m       instruments
}

type instruments struct {
	created        metric.Int64Counter
	repeated       metric.Int64Counter
	replayed       metric.Int64Counter
	fromURLSkipped metric.Int64Counter
	randomRetries  metric.Int64Counter
	randomFailed   metric.Int64Counter
	seqSkipped     metric.Int64Counter
	refused        metric.Int64Counter
	cacheFailed    metric.Int64Counter
	swept          metric.Int64Counter
	hashBusy       metric.Int64Counter
}

// Deps are the Service's collaborators.
type Deps struct {
	Store   Store
	Redis   redis.Cmdable
	Blocks  *codegen.Blocks
	Random  *codegen.Random
	FromURL *codegen.FromURL
	Policy  urlcheck.Policy
	Scanner urlcheck.Scanner
	Quota   *quota.Client
	// Hashes bounds the password hashes (Argon2id, 19 MiB each) the
	// process runs at once, over every call that hashes.
	Hashes *capacity.Gate
	// Domains keeps tenants' custom domains; nil: the domain RPCs answer
	// UNIMPLEMENTED and links take no domain.
	Domains DomainStore
	// TXT looks up verification records; nil: only ApproveDomain verifies.
	TXT   TXTResolver
	Log   *slog.Logger
	Meter metric.Meter
}

// New builds the service.
func New(opts Options, d Deps) (*Service, error) {
	s := &Service{opts: opts, store: d.Store, rdb: d.Redis, blocks: d.Blocks, random: d.Random, fromURL: d.FromURL,
		policy: d.Policy, scanner: d.Scanner, quota: d.Quota, hashes: d.Hashes, domains: d.Domains, txt: d.TXT, log: d.Log,
		etagKey: opts.ETagKey}
	if len(s.etagKey) == 0 {
		s.etagKey = etagKeyWithoutOptions
	}
	var errs []error
	counter := func(name, desc, unit string) metric.Int64Counter {
		c, err := d.Meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return c
	}
	s.m = instruments{
		created: counter("kurz.shortener.links.created", "Links created, by code mode", "{link}"),
		repeated: counter("kurz.shortener.from_url.existing",
			"Creates with codes from the URL answered with the tenant's existing link of the URL (nothing created, no quota spent)", "{call}"),
		replayed: counter("kurz.shortener.idempotent.replayed",
			"Creates with an idempotency key answered with the link the key made (nothing created; no quota spent unless the call raced the create that made it)", "{call}"),
		fromURLSkipped: counter("kurz.shortener.from_url.skipped",
			"Candidate codes from a URL skipped because another link held them", "{code}"),
		randomRetries: counter("kurz.shortener.random_code.retries",
			"Random codes that collided with an existing code and were drawn again; a rising rate means the keyspace fills: lengthen codes", "{retry}"),
		randomFailed: counter("kurz.shortener.random_code.exhausted",
			"CreateLink calls that gave up after every random attempt collided", "{call}"),
		seqSkipped: counter("kurz.shortener.sequential_code.skipped",
			"Sequential IDs skipped because a custom alias already held their code", "{id}"),
		refused: counter("kurz.shortener.urls.refused", "Long URLs refused, by reason", "{url}"),
		cacheFailed: counter("kurz.shortener.cache.write_failures",
			"Write-throughs to Redis that failed after the commit (a change of a link is retried until it succeeds; a new link's entry is filled on a read)", "{write}"),
		swept: counter("kurz.shortener.links.blocklisted",
			"Existing links disabled by a sweep because their destination joined the blocklist", "{link}"),
		hashBusy: counter("kurz.shortener.password_hash.refused",
			"Password hashes refused because every hashing slot stayed busy (KURZ_SHORTENER_MAX_CONCURRENT_HASHES); the call was answered UNAVAILABLE", "{hash}"),
	}
	errs = append(errs, observeInvalidations(d.Meter, d.Store))
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("shortener metrics: %w", err)
	}
	return s, nil
}

// tenant returns the caller's tenant from metadata, or anonymous if allowed.
func (s *Service) tenant(ctx context.Context) (string, error) {
	return Tenant(ctx, s.opts.AllowAnonymous)
}

// Tenant returns the caller's tenant from metadata: UNAUTHENTICATED without
// one, unless allowAnonymous makes it "anonymous". Every shortener API
// scopes its calls with it.
func Tenant(ctx context.Context, allowAnonymous bool) (string, error) {
	t := callmeta.Tenant(ctx)
	switch {
	case t == "" && allowAnonymous:
		return callmeta.AnonymousTenant, nil
	case t == "":
		return "", rpcerr.WithDetails(codes.Unauthenticated,
			"no tenant: call through the gateway with an API key (anonymous creation is disabled)",
			rpcerr.Info(rpcerr.ReasonTenantMissing, nil))
	case len(t) > maxTenantLen:
		return "", status.Error(codes.Unauthenticated, "the tenant metadata is not valid")
	}
	return t, nil
}

// CreateLink validates, checks the quota, allocates a code, stores the link
// and writes it through to Redis. A password is hashed (Argon2id) only once
// the quota allowed the call, and only its hash is stored and returned to
// nobody: responses say password_protected.
//
// With CODE_MODE_FROM_URL, the tenant's working link made from the same
// (normalised) URL, if there is one, is returned as it is (created false)
// before the quota is asked: a repeat spends no creation quota and changes
// nothing. A link of the URL that is disabled, expired or has its visits
// spent is not returned: a new link, with a new code, takes the URL over
// from it. Two calls that race to create it make one link: the loser's
// insert meets the unique index and returns the winner's link. The
// anonymous tenant may not use the mode (PERMISSION_DENIED
// FROM_URL_TENANT_REQUIRED): its links belong to every anonymous caller.
//
// With an idempotency key (metadata idempotency-key; see idempotent), the
// tenant's link made with the key is returned (created false) before
// anything else, the request's own checks included (an expiry that has
// passed since would refuse it), when it was made by the same request;
// another request with the key is INVALID_ARGUMENT IDEMPOTENCY_KEY_REUSED.
// A keyed create that meets a link made concurrently (its code, its URL)
// asks the key first too.
func (s *Service) CreateLink(ctx context.Context, req *shortenerv1.CreateLinkRequest) (*shortenerv1.CreateLinkResponse, error) {
	tenant, err := s.tenant(ctx)
	if err != nil {
		return nil, err
	}
	key, hash, err := idempotent(ctx, tenant, req)
	if err != nil {
		return nil, err
	}
	if resp, err := s.replay(ctx, tenant, key, hash); resp != nil || err != nil {
		return resp, err
	}
	d, err := s.prepare(req)
	if err == nil {
		err = modeAllowed(tenant, d.mode)
	}
	if err != nil {
		return nil, toStatus(ctx, s.log, "create", err)
	}
	l, mode := d.link, d.mode
	l.Tenant, l.RequestKey, l.RequestHash = tenant, key, hash
	domainKnown := false
	if mode == shortenerv1.CodeMode_CODE_MODE_FROM_URL {
		// The link of this URL is the tenant's on the domain asked for, so
		// the domain is checked first here.
		if l.Domain, err = s.linkDomain(ctx, tenant, req.GetDomain()); err != nil {
			return nil, toStatus(ctx, s.log, "create", err)
		}
		domainKnown = true
		l.URLKey = codegen.URLKey(l.Domain, l.LongURL)
		existing, err := s.workingFromURL(ctx, tenant, l.URLKey)
		if err == nil {
			s.m.repeated.Add(ctx, 1)
			return &shortenerv1.CreateLinkResponse{Link: s.toProto(existing)}, nil
		}
		if !errors.Is(err, linkstore.ErrNotFound) {
			return nil, toStatus(ctx, s.log, "create", err)
		}
	}
	var releaseHash func()
	if d.password != "" {
		if releaseHash, err = s.hashSlot(ctx); err != nil {
			return nil, toStatus(ctx, s.log, "create", err)
		}
		defer releaseHash()
	}
	if err := s.checkQuota(ctx, tenant, 1, chargeCreate); err != nil {
		return nil, err
	}
	// The domain after the quota: its check reads PostgreSQL.
	if !domainKnown {
		if l.Domain, err = s.linkDomain(ctx, tenant, req.GetDomain()); err != nil {
			return nil, toStatus(ctx, s.log, "create", err)
		}
	}
	ds := destinationsOf(l)
	if err := loopOn(l.Domain, ds); err != nil {
		return nil, err
	}
	// Destinations on a domain kurz serves are refused by the insert
	// itself (one statement); the refusal is explained after it.
	l.RefuseHosts = s.refuseHosts(ds)
	if mode == shortenerv1.CodeMode_CODE_MODE_CUSTOM {
		l.Code = linkdomain.Key(l.Domain, l.Code)
	}
	if err := s.scanLink(ctx, l); err != nil {
		return nil, toStatus(ctx, s.log, "create", err)
	}
	if d.password != "" {
		l.PasswordHash, err = hashIn(d.password)
		releaseHash()
		if err != nil {
			return nil, toStatus(ctx, s.log, "create", err)
		}
	}

	var stored linkstore.Link
	switch mode {
	case shortenerv1.CodeMode_CODE_MODE_CUSTOM:
		stored, err = s.store.Insert(ctx, l)
		if errors.Is(err, linkstore.ErrCodeTaken) {
			if resp, err := s.replay(ctx, tenant, key, hash); resp != nil || err != nil {
				return resp, err // a racer with the key holds the alias
			}
			// A retry of this very create, whose first answer was lost (a
			// client timeout; a 503 after the gateway's deadline, when the
			// insert may have committed): the alias is already the
			// tenant's link to the same URL. It gets that link, not
			// created, as a CODE_MODE_FROM_URL repeat does, so that a
			// create with an alias is safe to send again.
			if same, err := s.store.Get(ctx, tenant, l.Code); err == nil && same.LongURL == l.LongURL {
				s.m.repeated.Add(ctx, 1)
				return &shortenerv1.CreateLinkResponse{Link: s.toProto(same)}, nil
			}
			return nil, aliasTaken(req.GetCustomAlias())
		}
	case shortenerv1.CodeMode_CODE_MODE_RANDOM:
		stored, err = s.insertRandom(ctx, l)
	case shortenerv1.CodeMode_CODE_MODE_FROM_URL:
		var created bool
		if stored, created, err = s.insertFromURL(ctx, l); err == nil && !created {
			if resp, err := s.replay(ctx, tenant, key, hash); resp != nil || err != nil {
				return resp, err // a racer with the key made the URL's link
			}
			s.m.repeated.Add(ctx, 1)
			return &shortenerv1.CreateLinkResponse{Link: s.toProto(stored)}, nil
		}
	default:
		stored, err = s.insertSequential(ctx, l)
	}
	if errors.Is(err, linkstore.ErrRequestTaken) {
		// A concurrent create with the key committed first: its link.
		if resp, err := s.replay(ctx, tenant, key, hash); resp != nil || err != nil {
			return resp, err
		}
		return nil, status.Error(codes.Aborted,
			"the link made with this idempotency key was deleted while this create ran; send it again to make a new one")
	}
	if errors.Is(err, linkstore.ErrHostServed) {
		return nil, s.servedLoop(ctx, ds)
	}
	if err != nil {
		return nil, toStatus(ctx, s.log, "create", err)
	}
	s.m.created.Add(ctx, 1, metric.WithAttributes(attribute.String("mode", modeName(mode))))
	s.writeThrough(ctx, "create", stored)
	return &shortenerv1.CreateLinkResponse{Link: s.toProto(stored), Created: true}, nil
}

// idempotent reads the call's idempotency key (IdempotencyKey): nil
// without one; else the key's SHA-256 (linkstore.Link.RequestKey) and
// req's (RequestHash: RequestHash of req with the password replaced by a
// mark that there is one; a fast hash of the password stored next to its
// Argon2id hash would undo the latter, so two requests that differ in
// their password only are one request here).
func idempotent(ctx context.Context, tenant string, req *shortenerv1.CreateLinkRequest) (key, hash []byte, err error) {
	if key, err = IdempotencyKey(ctx, tenant); key == nil || err != nil {
		return nil, nil, err
	}
	r := proto.CloneOf(req)
	if r.Password != "" {
		r.Password = "\x00set"
	}
	hash, err = RequestHash(r)
	return key, hash, err
}

// IdempotencyKey reads the idempotency key of a create
// (callmeta.IdempotencyKey): nil without one, else its SHA-256, which
// the create stores to find its repeats by. INVALID_ARGUMENT for a
// malformed key, and for the anonymous tenant: every anonymous caller
// shares it, so a key would hand one caller another's creation.
func IdempotencyKey(ctx context.Context, tenant string) ([]byte, error) {
	k, err := callmeta.IncomingIdempotencyKey(ctx)
	switch {
	case err != nil:
		return nil, rpcerr.WithDetails(codes.InvalidArgument, err.Error(), rpcerr.Info(callmeta.ReasonIdempotencyKeyInvalid, nil))
	case k == "":
		return nil, nil
	case tenant == callmeta.AnonymousTenant:
		return nil, rpcerr.WithDetails(codes.InvalidArgument,
			"an idempotency key needs an API key: anonymous callers share one tenant, so a key would return other people's links",
			rpcerr.Info(callmeta.ReasonIdempotencyKeyUnsupported, nil))
	}
	sum := sha256.Sum256([]byte(k))
	return sum[:], nil
}

// RequestHash is the SHA-256 of req's deterministic wire form: what a
// create with an idempotency key stores to tell its repeats (the same
// request) from another request sent with the key.
func RequestHash(req proto.Message) ([]byte, error) {
	wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "the request cannot be encoded: %v", err)
	}
	sum := sha256.Sum256(wire)
	return sum[:], nil
}

// IdempotencyKeyReused refuses a create whose idempotency key made what
// (named by meta) for another request.
func IdempotencyKeyReused(what string, meta map[string]string) error {
	return rpcerr.WithDetails(codes.InvalidArgument,
		"this idempotency key made "+what+" for another request; use a new key for a new request",
		rpcerr.Info(callmeta.ReasonIdempotencyKeyReused, meta))
}

// replay answers a create with an idempotency key (key, its SHA-256) from
// the tenant's link made with the key, as the link is now (created
// false): nil, nil without a key or such a link. A link made by another
// request (hash) is INVALID_ARGUMENT IDEMPOTENCY_KEY_REUSED.
func (s *Service) replay(ctx context.Context, tenant string, key, hash []byte) (*shortenerv1.CreateLinkResponse, error) {
	if key == nil {
		return nil, nil
	}
	made, err := s.store.ByRequest(ctx, tenant, key)
	switch {
	case errors.Is(err, linkstore.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, toStatus(ctx, s.log, "create", err)
	case !bytes.Equal(made.RequestHash, hash):
		domain, code := linkdomain.Split(made.Code)
		meta := map[string]string{"code": code}
		if domain != "" {
			meta["domain"] = domain
		}
		return nil, IdempotencyKeyReused("a link", meta)
	}
	s.m.replayed.Add(ctx, 1)
	return &shortenerv1.CreateLinkResponse{Link: s.toProto(made)}, nil
}

// workingFromURL is the store's FromURL, less a link whose visits are
// spent: it answers 410, so it gives the URL up to a new link
// (linkstore.ErrNotFound), as a disabled or expired one does.
func (s *Service) workingFromURL(ctx context.Context, tenant string, key []byte) (linkstore.Link, error) {
	l, err := s.store.FromURL(ctx, tenant, key)
	if err != nil || !s.visitsSpent(ctx, l) {
		return l, err
	}
	if err := s.store.ReleaseURLKey(ctx, tenant, l.Code, key); err != nil {
		return linkstore.Link{}, err
	}
	return linkstore.Link{}, linkstore.ErrNotFound
}

// workingFromURLs is workingFromURL for a batch's URL keys, by
// string(key): one FromURLs query and one Redis pipeline (visitsSpentMany)
// whatever their number. Each link whose visits are spent gives its key up
// in a statement of its own, as workingFromURL's does; that happens once
// per link, since the link no longer holds the key afterwards.
func (s *Service) workingFromURLs(ctx context.Context, tenant string, keys [][]byte) (map[string]linkstore.Link, error) {
	if len(keys) == 0 {
		return map[string]linkstore.Link{}, nil
	}
	found, err := s.store.FromURLs(ctx, tenant, keys)
	if err != nil {
		return nil, err
	}
	spent := s.visitsSpentMany(ctx, slices.Collect(maps.Values(found)))
	for key, l := range found {
		if !spent[l.Code] {
			continue
		}
		if err := s.store.ReleaseURLKey(ctx, tenant, l.Code, []byte(key)); err != nil {
			return nil, err
		}
		delete(found, key)
	}
	return found, nil
}

// visitsSpent reports whether l is visit-limited and its visits, counted
// in Redis by the redirect (linkcache.VisitsKey), are all spent (see
// spentBy).
func (s *Service) visitsSpent(ctx context.Context, l linkstore.Link) bool {
	if l.MaxVisits <= 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.CacheTimeout)
	defer cancel()
	n, err := s.rdb.Get(ctx, linkcache.VisitsKey(l.Code)).Int64()
	return s.spentBy(ctx, l, n, err)
}

// visitsSpentMany is visitsSpent for many links, by code (true for those
// spent), in one Redis pipeline: the counters fall in many slots, which an
// MGET could not span, and the cluster client splits a pipeline by node,
// so they cost one round trip per node rather than one per link. Links
// without a visit limit are not read.
func (s *Service) visitsSpentMany(ctx context.Context, links []linkstore.Link) map[string]bool {
	spent := make(map[string]bool)
	var limited []linkstore.Link
	for _, l := range links {
		if l.MaxVisits > 0 {
			limited = append(limited, l)
		}
	}
	if len(limited) == 0 {
		return spent
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.CacheTimeout)
	defer cancel()
	pipe := s.rdb.Pipeline()
	reads := make([]*redis.StringCmd, len(limited))
	for i, l := range limited {
		reads[i] = pipe.Get(ctx, linkcache.VisitsKey(l.Code))
	}
	// Exec's error is the first command's that failed, redis.Nil (a
	// counter not there yet) included: each read is judged on its own.
	_, _ = pipe.Exec(ctx)
	for i, l := range limited {
		n, err := reads[i].Int64()
		if s.spentBy(ctx, l, n, err) {
			spent[l.Code] = true
		}
	}
	return spent
}

// spentBy reports whether the read (n, err) of l's visit counter says its
// visits are spent. No counter (redis.Nil) is no visit yet. A counter that
// cannot be read counts as not spent: the link is handed back as it would
// have been before, never replaced on a guess.
func (s *Service) spentBy(ctx context.Context, l linkstore.Link, n int64, err error) bool {
	switch {
	case errors.Is(err, redis.Nil):
		return false
	case err != nil:
		s.log.WarnContext(ctx, "visit counter unreadable; the link made from the URL is returned as it is", "code", l.Code, "err", err)
		return false
	}
	return n >= l.MaxVisits
}

// modeAllowed refuses CODE_MODE_FROM_URL and custom aliases to the
// anonymous tenant. Every anonymous caller shares that tenant, so the mode
// would hand one caller another's link of the URL (its tags, targets,
// limits) and tell anybody whether someone shortened a URL; and nobody
// holds a key for it, so an alias taken anonymously could never be
// deleted (nor would deleting free it: a deleted alias stays taken), and
// anybody could squat any name for good.
func modeAllowed(tenant string, mode shortenerv1.CodeMode) error {
	if tenant != callmeta.AnonymousTenant {
		return nil
	}
	switch mode {
	case shortenerv1.CodeMode_CODE_MODE_FROM_URL:
		return rpcerr.WithDetails(codes.PermissionDenied,
			"mode CODE_MODE_FROM_URL needs an API key: anonymous callers share one tenant, so it would return other people's links; use another mode",
			rpcerr.Info(ReasonFromURLTenantRequired, map[string]string{"field": "mode"}))
	case shortenerv1.CodeMode_CODE_MODE_CUSTOM:
		return rpcerr.WithDetails(codes.PermissionDenied,
			"custom_alias needs an API key: an anonymous link can never be deleted, so its alias would be taken for good; leave custom_alias out for a generated code",
			rpcerr.Info(ReasonAliasTenantRequired, map[string]string{"field": "custom_alias"}))
	}
	return nil
}

// fromURLRaces bounds how often insertFromURL tries a candidate again
// because the link that held the URL stopped working between its insert
// and its read.
const fromURLRaces = 3

// fromURLInserts bounds the inserts of one insertFromURL: a candidate
// found free can be taken by a concurrent insert before this one, and the
// search goes on past it.
const fromURLInserts = 8

// insertFromURL stores l (URLKey set) under the first of its URL's
// candidate codes that is free; the tenant's disabled or expired link of
// the URL, if any, gives the URL up to it (linkstore.Store.Insert). The
// first candidate is inserted straight away; once it is taken (by the
// tenant's earlier links of the URL, each of which keeps its code, or by
// another link), codegen.FreeCandidate finds the next free one in a few
// queries, however many links the URL had. created is false when the
// tenant's working link of the URL appeared meanwhile (a concurrent create
// won): that link is returned. No free candidate is FAILED_PRECONDITION:
// retrying cannot help, another mode can.
func (s *Service) insertFromURL(ctx context.Context, l linkstore.Link) (stored linkstore.Link, created bool, err error) {
	races, attempt := 0, 0
	for inserts := 0; inserts < fromURLInserts; {
		l.Code = s.fromURLCode(l, attempt)
		stored, err = s.store.Insert(ctx, l)
		switch {
		case err == nil:
			return stored, true, nil
		case errors.Is(err, linkstore.ErrURLTaken):
			stored, err = s.store.FromURL(ctx, l.Tenant, l.URLKey)
			if errors.Is(err, linkstore.ErrNotFound) && races < fromURLRaces {
				// The holder was disabled, expired or deleted since the
				// insert: the next insert takes its place.
				races++
				continue
			}
			return stored, false, err
		case !errors.Is(err, linkstore.ErrCodeTaken):
			return linkstore.Link{}, false, err
		}
		inserts++
		next, ok, ferr := codegen.FreeCandidate(attempt+1, func(attempts []int) ([]bool, error) {
			return s.candidatesTaken(ctx, l, attempts)
		})
		if ferr != nil {
			return linkstore.Link{}, false, ferr
		}
		if !ok {
			s.m.fromURLSkipped.Add(ctx, 1)
			s.log.WarnContext(ctx, "codes from the url exhausted: no candidate is free", "tenant", l.Tenant, "after", attempt)
			return linkstore.Link{}, false, rpcerr.WithDetails(codes.FailedPrecondition,
				"no code this URL can have is free: each is held by another link, or by one of your earlier links of the URL (a link keeps its code even once deleted); create it with another mode",
				rpcerr.Info(ReasonFromURLExhausted, map[string]string{"field": "mode"}))
		}
		s.m.fromURLSkipped.Add(ctx, int64(next-attempt))
		attempt = next
	}
	s.log.WarnContext(ctx, "codes from the url: every free candidate found was taken before its insert", "tenant", l.Tenant, "inserts", fromURLInserts)
	return linkstore.Link{}, false, status.Errorf(codes.Aborted,
		"the %d free codes found for this URL were each taken by another link before this create could; send it again", fromURLInserts)
}

// fromURLCode is l's candidate code attempt, as its key on l's domain.
func (s *Service) fromURLCode(l linkstore.Link, attempt int) string {
	return linkdomain.Key(l.Domain, s.fromURL.Candidate(l.Tenant, l.LongURL, attempt))
}

// candidatesTaken reports which of l's candidate codes attempts are held
// by a link, in one query.
func (s *Service) candidatesTaken(ctx context.Context, l linkstore.Link, attempts []int) ([]bool, error) {
	keys := make([]string, len(attempts))
	for i, a := range attempts {
		keys[i] = s.fromURLCode(l, a)
	}
	held, err := s.store.Taken(ctx, keys)
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(keys))
	for i, k := range keys {
		out[i] = held[k]
	}
	return out, nil
}

// draft is a validated CreateLinkRequest: the row to insert (without its
// code unless custom, and without the password hash), its code mode, and the
// password still to hash (empty: none).
type draft struct {
	link     linkstore.Link
	mode     shortenerv1.CodeMode
	password string
}

// prepare validates a CreateLinkRequest into a draft, without I/O.
func (s *Service) prepare(req *shortenerv1.CreateLinkRequest) (draft, error) {
	l, mode, err := s.prepareLink(req)
	if err != nil {
		return draft{}, err
	}
	if l.Tags, err = normalizeTags(req.GetTags()); err != nil {
		return draft{}, err
	}
	if err := checkTitle(req.GetTitle()); err != nil {
		return draft{}, err
	}
	l.Title = req.GetTitle()
	if err := checkMaxVisits(req.GetMaxVisits()); err != nil {
		return draft{}, err
	}
	l.MaxVisits = req.GetMaxVisits()
	if req.GetPassword() != "" {
		if err := checkPassword(req.GetPassword()); err != nil {
			return draft{}, err
		}
	}
	t, err := s.normalizeTargets(req.GetDeviceTargets())
	if err != nil {
		return draft{}, err
	}
	l.IOSURL, l.AndroidURL, l.DesktopURL = t.IOS, t.Android, t.Desktop
	if l.Rules, err = s.rulesOf(req.GetRules(), req.GetVariants()); err != nil {
		return draft{}, err
	}
	return draft{link: l, mode: mode, password: req.GetPassword()}, nil
}

// prepareLink validates the fields a link had before tags, visit limits,
// passwords and device targets: long_url, the code mode and alias, the
// redirect type and the expiry.
func (s *Service) prepareLink(req *shortenerv1.CreateLinkRequest) (linkstore.Link, shortenerv1.CodeMode, error) {
	var l linkstore.Link
	target, err := s.policy.Normalize(req.GetLongUrl())
	if err != nil {
		s.countRefused(err)
		return l, 0, err
	}
	l.LongURL = target
	mode := req.GetMode()
	alias := req.GetCustomAlias()
	switch {
	case alias != "" && (mode == shortenerv1.CodeMode_CODE_MODE_UNSPECIFIED || mode == shortenerv1.CodeMode_CODE_MODE_CUSTOM):
		mode = shortenerv1.CodeMode_CODE_MODE_CUSTOM
		if problem := linkcode.AliasProblem(alias); problem != "" {
			reason := ReasonAliasInvalid
			if linkcode.Reserved(alias) {
				reason = ReasonAliasReserved
			}
			return l, 0, rpcerr.Invalidf("custom_alias", reason, "custom_alias: %s", problem)
		}
		l.Code = alias
	case alias != "":
		return l, 0, rpcerr.Invalidf("custom_alias", ReasonModeInvalid, "custom_alias needs mode CODE_MODE_CUSTOM (or no mode)")
	case mode == shortenerv1.CodeMode_CODE_MODE_CUSTOM:
		return l, 0, rpcerr.Invalidf("custom_alias", ReasonAliasInvalid, "mode CODE_MODE_CUSTOM needs custom_alias")
	case mode == shortenerv1.CodeMode_CODE_MODE_UNSPECIFIED:
		mode = shortenerv1.CodeMode_CODE_MODE_SEQUENTIAL
	case mode != shortenerv1.CodeMode_CODE_MODE_SEQUENTIAL && mode != shortenerv1.CodeMode_CODE_MODE_RANDOM &&
		mode != shortenerv1.CodeMode_CODE_MODE_FROM_URL:
		return l, 0, rpcerr.Invalidf("mode", ReasonModeInvalid, "mode %d is not a known code mode", mode)
	}
	if l.Status, err = statusOf(req.GetRedirectType()); err != nil {
		return l, 0, err
	}
	if req.ExpireTime != nil {
		exp, err := futureTime(req.GetExpireTime())
		if err != nil {
			return l, 0, err
		}
		l.Expires = &exp
	}
	return l, mode, nil
}

// futureTime is an expiry as it is kept: cut to the microsecond before it,
// as PostgreSQL's timestamptz keeps it (and pgx sends it), so that what is
// checked, stored and answered is one time; clients send nanoseconds, and
// are not refused for them.
func futureTime(ts *timestamppb.Timestamp) (time.Time, error) {
	if err := ts.CheckValid(); err != nil {
		return time.Time{}, rpcerr.Invalidf("expire_time", ReasonExpireTimeInvalid, "expire_time is not a valid timestamp")
	}
	t := ts.AsTime().Truncate(time.Microsecond)
	if !t.After(time.Now()) {
		return time.Time{}, rpcerr.Invalidf("expire_time", ReasonExpireTimeInvalid, "expire_time must be in the future")
	}
	return t, nil
}

func statusOf(rt shortenerv1.RedirectType) (int, error) {
	switch rt {
	case shortenerv1.RedirectType_REDIRECT_TYPE_UNSPECIFIED:
		return 0, nil
	case shortenerv1.RedirectType_REDIRECT_TYPE_FOUND:
		return 302, nil
	case shortenerv1.RedirectType_REDIRECT_TYPE_MOVED_PERMANENTLY:
		return 301, nil
	case shortenerv1.RedirectType_REDIRECT_TYPE_TEMPORARY_REDIRECT:
		return 307, nil
	case shortenerv1.RedirectType_REDIRECT_TYPE_PERMANENT_REDIRECT:
		return 308, nil
	}
	return 0, rpcerr.Invalidf("redirect_type", ReasonRedirectInvalid, "redirect_type %d is not a known redirect type", rt)
}

func redirectTypeOf(status int) shortenerv1.RedirectType {
	switch status {
	case 302:
		return shortenerv1.RedirectType_REDIRECT_TYPE_FOUND
	case 301:
		return shortenerv1.RedirectType_REDIRECT_TYPE_MOVED_PERMANENTLY
	case 307:
		return shortenerv1.RedirectType_REDIRECT_TYPE_TEMPORARY_REDIRECT
	case 308:
		return shortenerv1.RedirectType_REDIRECT_TYPE_PERMANENT_REDIRECT
	}
	return shortenerv1.RedirectType_REDIRECT_TYPE_UNSPECIFIED
}

func modeName(m shortenerv1.CodeMode) string {
	switch m {
	case shortenerv1.CodeMode_CODE_MODE_RANDOM:
		return "random"
	case shortenerv1.CodeMode_CODE_MODE_CUSTOM:
		return "custom"
	case shortenerv1.CodeMode_CODE_MODE_FROM_URL:
		return "from_url"
	}
	return "sequential"
}

func (s *Service) countRefused(err error) {
	var ue *urlcheck.Error
	if errors.As(err, &ue) {
		s.m.refused.Add(context.Background(), 1, metric.WithAttributes(attribute.String("reason", ue.Reason)))
	}
}

// charge is what a call spends of the link creation quota on.
type charge int

const (
	chargeCreate   charge = iota // one CreateLink
	chargeBatch                  // a BatchCreateLinks, for its valid items
	chargePassword               // an UpdateLink that sets a password
)

// checkQuota asks the limiter (per tenant and per client IP) for n links at
// once: one CheckQuota of cost n, so a batch costs what its links would cost
// one by one, and is allowed or denied as a whole. Setting a password on an
// existing link costs one link: it costs the service what a create with a
// password does (an Argon2id hash). Over quota is RESOURCE_EXHAUSTED with
// the retry-after; a silent limiter follows the configured policy
// (quota.Client logs and counts that).
func (s *Service) checkQuota(ctx context.Context, tenant string, n int, kind charge) error {
	desc := map[string]string{"tenant": tenant}
	if ip := s.opts.Keying.KeyString(callmeta.ClientIP(ctx)); ip != "" {
		desc["ip"] = ip
	}
	d := s.quota.Check(ctx, QuotaDomain, desc, uint32(n), s.opts.LimiterPolicy)
	switch {
	case d.Allowed:
		return nil
	case d.Degraded:
		return rpcerr.RetryLater(codes.Unavailable, ReasonLimiterDown,
			"link creation is paused: the rate limiter is unreachable", time.Second, nil)
	}
	var rule string
	if d.Rule != "" {
		rule = " (rule " + d.Rule + ")"
	}
	if d.MaxCost > 0 {
		// Waiting would not help: the quota never holds this many (only a
		// batch costs more than one link).
		msg := fmt.Sprintf("the link creation quota%s allows at most %d links at once, so this batch of %d can never be created; nothing was created: send batches (or imports) of at most %d links",
			rule, d.MaxCost, n, d.MaxCost)
		return rpcerr.BadRequestWith("requests", ReasonBatchSizeInvalid, msg, map[string]string{MetaMaxBatch: fmt.Sprint(d.MaxCost)})
	}
	what := "too many links created" + rule
	switch kind {
	case chargePassword:
		what = "too many links created or passwords set" + rule + "; the password was not changed"
	case chargeBatch:
		what = fmt.Sprintf("the link creation quota%s cannot cover this batch of %d links; nothing was created", rule, n)
		if d.Limit > 0 {
			what += fmt.Sprintf(" (%d of %d left now)", d.Remaining, d.Limit)
		}
	}
	return rpcerr.RetryLater(codes.ResourceExhausted, rpcerr.ReasonRateLimited, what, d.RetryAfter, map[string]string{"rule": d.Rule})
}

// notRedirecting says why l answers 410 rather than redirecting:
// "disabled", "expired" or, when spent (its visits, as visitsSpent reads
// them; only worth reading when l is neither of the others), "spent"; ""
// while it redirects. CODE_MODE_FROM_URL gives up such a link's URL
// (workingFromURL) for the same reasons.
func notRedirecting(l linkstore.Link, spent bool) string {
	switch {
	case l.Disabled:
		return "disabled"
	case l.Expires != nil && !l.Expires.After(time.Now()):
		return "expired"
	case spent:
		return "spent"
	}
	return ""
}

// aliasNotRedirecting is the error of a batch item whose alias is the
// caller's link to the same URL that no longer redirects (why, from
// notRedirecting): answering that link as the item's would tell an import
// sent again that the row is there while its short URL answers 410.
func aliasNotRedirecting(alias, why string) error {
	fix := map[string]string{"disabled": "enable it", "expired": "give it a later expiry", "spent": "raise its visit limit"}[why]
	return rpcerr.WithDetails(codes.FailedPrecondition,
		fmt.Sprintf("the alias %q is taken by your link to this URL, which no longer redirects (%s): %s, or use another alias", alias, why, fix),
		rpcerr.Info(ReasonAliasNotRedirecting, map[string]string{"field": "custom_alias"}))
}

// aliasTaken is the error of a custom alias a link holds already.
func aliasTaken(alias string) error {
	return rpcerr.WithDetails(codes.AlreadyExists, fmt.Sprintf("the alias %q is already taken; choose another", alias),
		rpcerr.Info(ReasonAliasTaken, map[string]string{"field": "custom_alias"}))
}

// scanLink runs the scanner over every destination of l: long_url, the
// device targets, the rules and the variants.
func (s *Service) scanLink(ctx context.Context, l linkstore.Link) error {
	if err := s.scan(ctx, l.LongURL); err != nil {
		return err
	}
	if err := s.scanTargets(ctx, linkstore.DeviceURLs{IOS: l.IOSURL, Android: l.AndroidURL, Desktop: l.DesktopURL}); err != nil {
		return err
	}
	return s.scanRules(ctx, l.Rules)
}

// scanKept runs the scanner over the destinations of the stored link l
// that the update ch keeps as they are: long_url, the device targets, the
// rules and the variants it does not set (those it sets are scanned on
// their own).
func (s *Service) scanKept(ctx context.Context, l linkstore.Link, ch linkstore.Changes) error {
	if ch.LongURL == nil {
		if err := s.scan(ctx, l.LongURL); err != nil {
			return err
		}
	}
	if ch.Targets == nil {
		if err := s.scanTargets(ctx, linkstore.DeviceURLs{IOS: l.IOSURL, Android: l.AndroidURL, Desktop: l.DesktopURL}); err != nil {
			return err
		}
	}
	var kept linkrules.Set
	if l.Rules != nil {
		if ch.Rules == nil {
			kept.Rules = l.Rules.Rules
		}
		if ch.Variants == nil {
			kept.Variants = l.Rules.Variants
		}
	}
	return s.scanRules(ctx, &kept)
}

func (s *Service) scan(ctx context.Context, target string) error {
	u, err := url.Parse(target)
	if err != nil {
		return fmt.Errorf("re-parse normalised URL: %w", err)
	}
	v, err := s.scanner.Scan(ctx, u)
	if err != nil {
		s.log.WarnContext(ctx, "url scanner failed", "err", err)
		return rpcerr.RetryLater(codes.Unavailable, ReasonScannerDown, "the URL scanner is unavailable", time.Second, nil)
	}
	if v.Blocked {
		s.log.InfoContext(ctx, "url blocked", "host", u.Hostname(), "why", v.Why)
		s.m.refused.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", urlcheck.ReasonBlocked)))
		return &urlcheck.Error{Reason: urlcheck.ReasonBlocked, Message: "this destination is blocked (phishing, malware or abuse)"}
	}
	return nil
}

// hashPassword hashes password in one of the process's hashing slots
// (hashSlot).
func (s *Service) hashPassword(ctx context.Context, password string) (string, error) {
	release, err := s.hashSlot(ctx)
	if err != nil {
		return "", err
	}
	defer release()
	return hashIn(password)
}

// hashSlot takes one of the process's hashing slots (Deps.Hashes): with
// every slot busy for the gate's short wait, the call is refused
// UNAVAILABLE with a retry delay, so that a burst of passwords cannot hold
// more than the slots' memory (19 MiB each) at once. A single create or
// update takes its slot before it charges the quota: the refusal says
// nothing was created and asks for the same request again, which must not
// have cost a link of the quota (a free tenant's burst of 10 lost 6 that
// way). release may be called more than once.
func (s *Service) hashSlot(ctx context.Context) (release func(), err error) {
	release, err = s.hashes.Acquire(ctx)
	if errors.Is(err, capacity.ErrBusy) {
		s.m.hashBusy.Add(ctx, 1)
		return nil, rpcerr.RetryLater(codes.Unavailable, ReasonHashingBusy,
			"too many passwords are being hashed right now; nothing was created or changed", time.Second, nil)
	}
	if err != nil {
		return nil, err
	}
	return sync.OnceFunc(release), nil
}

// hashIn hashes password, in a slot the caller holds.
func hashIn(password string) (string, error) {
	hash, err := linkpass.Hash(password)
	if err != nil {
		return "", fmt.Errorf("hash password: %w", err)
	}
	return hash, nil
}

func (s *Service) insertSequential(ctx context.Context, l linkstore.Link) (linkstore.Link, error) {
	// A custom alias can hold a code the sequence reaches later: skip it.
	for range 1000 {
		code, err := s.blocks.NextCode(ctx)
		if err != nil {
			return linkstore.Link{}, err
		}
		l.Code = linkdomain.Key(l.Domain, code)
		stored, err := s.store.Insert(ctx, l)
		if !errors.Is(err, linkstore.ErrCodeTaken) {
			return stored, err
		}
		s.m.seqSkipped.Add(ctx, 1)
	}
	return linkstore.Link{}, errors.New("1000 sequential codes in a row were taken")
}

func (s *Service) insertRandom(ctx context.Context, l linkstore.Link) (linkstore.Link, error) {
	for attempt := 1; ; attempt++ {
		code, err := s.random.Code()
		if err != nil {
			return linkstore.Link{}, err
		}
		l.Code = linkdomain.Key(l.Domain, code)
		stored, err := s.store.Insert(ctx, l)
		if !errors.Is(err, linkstore.ErrCodeTaken) {
			return stored, err
		}
		if attempt == RandomAttempts {
			s.m.randomFailed.Add(ctx, 1)
			s.log.WarnContext(ctx, "random codes exhausted: every attempt collided", "attempts", attempt)
			return linkstore.Link{}, rpcerr.RetryLater(codes.Unavailable, ReasonCodesExhausted,
				fmt.Sprintf("no free random code found in %d attempts; try again, or use sequential mode", RandomAttempts),
				time.Second, nil)
		}
		s.m.randomRetries.Add(ctx, 1)
	}
}

// entry is what the redirect service needs to know about l.
func entry(l linkstore.Link) linkcache.Entry {
	if l.Deleted != nil || l.Disabled {
		return linkcache.Entry{State: linkcache.Gone, Tenant: l.Tenant}
	}
	e := linkcache.Entry{State: linkcache.Active, URL: l.LongURL, Tenant: l.Tenant, Status: l.Status,
		PasswordHash: l.PasswordHash, MaxVisits: l.MaxVisits}
	if l.Expires != nil {
		e.ExpiresAtMs = l.Expires.UnixMilli()
	}
	if t := targetsOf(l); t != nil {
		e.Targets = &linkcache.Targets{IOS: t.IOS, Android: t.Android, Desktop: t.Desktop}
	}
	if !l.Rules.Empty() {
		e.Rules = l.Rules
	}
	return e
}

// writeThrough sets the Redis entries of links just created, from the rows
// their insert returned, and publishes their codes (linkcache.WriteCreated:
// over nothing or a negative entry only, so a change committed since the
// insert, whose write-through came first, is never undone; one that comes
// later overwrites). One pipeline for a batch (the cluster client splits it
// per node): one round trip per node, not per link, and no PostgreSQL
// statement. A failure does not fail the call (the rows are committed): it
// is logged and counted, and a reader fills Redis from PostgreSQL (a
// negative entry met meanwhile lives KURZ_LINK_NEGATIVE_TTL). Changes of
// existing links go through refresh instead.
func (s *Service) writeThrough(ctx context.Context, op string, created ...linkstore.Link) {
	if len(created) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.CacheTimeout)
	defer cancel()
	failed := 0
	var err error
	if len(created) == 1 {
		_, err = linkcache.WriteCreated(ctx, s.rdb, created[0].Code, entry(created[0]), s.opts.CacheTTL)
	} else {
		pipe := s.rdb.Pipeline()
		for _, l := range created {
			linkcache.QueueWriteCreated(ctx, pipe, l.Code, entry(l), s.opts.CacheTTL)
		}
		var cmds []redis.Cmder
		cmds, err = pipe.Exec(ctx)
		for _, c := range cmds {
			if c.Err() != nil {
				failed++
			}
		}
	}
	if err == nil {
		return
	}
	s.m.cacheFailed.Add(ctx, int64(max(failed, 1)), metric.WithAttributes(attribute.String("op", op)))
	s.log.ErrorContext(ctx, "write-through failed", "op", op, "links", len(created), "failed_commands", failed, "err", err)
}

// toProto is l as the API shows it: the bare code and the domain apart, and
// the short URL on the link's domain (https://<domain>/<code>, or BaseURL's
// for the default domain).
func (s *Service) toProto(l linkstore.Link) *shortenerv1.Link {
	_, code := linkdomain.Split(l.Code)
	short := strings.TrimSuffix(s.opts.BaseURL, "/") + "/" + code
	if l.Domain != "" {
		short = "https://" + l.Domain + "/" + code
	}
	p := &shortenerv1.Link{
		Code:         code,
		ShortUrl:     short,
		LongUrl:      l.LongURL,
		Tenant:       l.Tenant,
		RedirectType: redirectTypeOf(l.Status),
		CreateTime:   timestamppb.New(l.Created),
		UpdateTime:   timestamppb.New(l.Updated),
		Disabled:     l.Disabled,
		Tags:         l.Tags,
		Title:        l.Title,
		MaxVisits:    l.MaxVisits,
		// Password is input only: never set here.
		PasswordProtected: l.PasswordHash != "",
	}
	if l.Domain != "" {
		p.Domain = &l.Domain // absent for the default domain
	}
	if l.Expires != nil {
		p.ExpireTime = timestamppb.New(*l.Expires)
	}
	if t := targetsOf(l); t != nil {
		p.DeviceTargets = &shortenerv1.DeviceTargets{IosUrl: t.IOS, AndroidUrl: t.Android, DesktopUrl: t.Desktop}
	}
	p.Rules, p.Variants = rulesProto(l.Rules)
	p.Etag = s.etag(l)
	return p
}

// GetLink returns one of the caller's links.
func (s *Service) GetLink(ctx context.Context, req *shortenerv1.GetLinkRequest) (*shortenerv1.GetLinkResponse, error) {
	tenant, err := s.tenant(ctx)
	if err != nil {
		return nil, err
	}
	key, ok := linkKey(req.GetDomain(), req.GetCode())
	if !linkcode.Plausible(req.GetCode()) || !ok {
		return nil, toStatus(ctx, s.log, "get", linkstore.ErrNotFound)
	}
	l, err := s.store.Get(ctx, tenant, key)
	if err != nil {
		return nil, toStatus(ctx, s.log, "get", err)
	}
	return &shortenerv1.GetLinkResponse{Link: s.toProto(l)}, nil
}

// ListLinks pages through the caller's links, newest first; with a tag, only
// those carrying it (the tag is validated and lower-cased like tags on
// create, and a page token only continues the listing of its own tag).
func (s *Service) ListLinks(ctx context.Context, req *shortenerv1.ListLinksRequest) (*shortenerv1.ListLinksResponse, error) {
	tenant, err := s.tenant(ctx)
	if err != nil {
		return nil, err
	}
	size := int(req.GetPageSize())
	switch {
	case size < 0:
		return nil, toStatus(ctx, s.log, "list", rpcerr.Invalidf("page_size", ReasonPageSizeInvalid, "page_size must not be negative"))
	case size == 0:
		size = DefaultPageSize
	case size > MaxPageSize:
		size = MaxPageSize
	}
	var tag string
	if req.GetTag() != "" {
		if tag, err = normalizeTag("tag", req.GetTag()); err != nil {
			return nil, toStatus(ctx, s.log, "list", err)
		}
	}
	page, err := s.store.List(ctx, tenant, size, req.GetPageToken(), tag)
	if err != nil {
		return nil, toStatus(ctx, s.log, "list", err)
	}
	resp := &shortenerv1.ListLinksResponse{NextPageToken: page.Next}
	budget := MaxPageBytes
	for i, l := range page.Links {
		pl := s.toProto(l)
		// What the link adds to the response: field tag, length, message.
		n := protowire.SizeTag(1) + protowire.SizeBytes(proto.Size(pl))
		if i > 0 && n > budget {
			resp.NextPageToken = linkstore.TokenAfter(page.Links[i-1], tag)
			break
		}
		budget -= n
		resp.Links = append(resp.Links, pl)
	}
	return resp, nil
}

// UpdateLink changes the fields named in update_mask and writes the result
// through, all in one statement (a failed call changes nothing). long_url
// and device_targets are re-validated (and scanned); device_targets
// replaces all three URLs (an unset or empty message clears them).
// Enabling a link (disabled false) scans every destination it will have
// after the update, the stored ones it keeps too, and is refused
// (URL_BLOCKED, the link stays as it was) if the scanner blocks one: a link
// the blocklist sweep disabled cannot be switched back on while its
// destination is blocked. tags replaces the tags, title the title ("" clears
// it); "password" sets a new
// password (validated, charged to the link creation quota like a new link,
// hashed) or, given "", removes it. max_visits changes the limit only: the
// visits counted so far in Redis (linkcache.VisitsKey) are kept, so raising
// the limit reopens a link that had reached it by the difference, and
// lowering it below the count closes the link at once; to count afresh,
// create a new link.
func (s *Service) UpdateLink(ctx context.Context, req *shortenerv1.UpdateLinkRequest) (*shortenerv1.UpdateLinkResponse, error) {
	tenant, err := s.tenant(ctx)
	if err != nil {
		return nil, err
	}
	link := req.GetLink()
	if link == nil {
		return nil, toStatus(ctx, s.log, "update", rpcerr.Invalidf("link", ReasonLinkRequired, "link is required, with its code"))
	}
	paths := req.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		return nil, toStatus(ctx, s.log, "update", rpcerr.Invalidf("update_mask", ReasonUpdateMaskInvalid,
			"update_mask is required: name the fields to change ("+updatable+")"))
	}
	var ch linkstore.Changes
	var password *string // the new password, hashed below; "" removes it
	for _, p := range paths {
		switch p {
		case "long_url":
			target, err := s.policy.Normalize(link.GetLongUrl())
			if err != nil {
				s.countRefused(err)
				return nil, toStatus(ctx, s.log, "update", err)
			}
			ch.LongURL = &target
		case "redirect_type":
			st, err := statusOf(link.GetRedirectType())
			if err != nil {
				return nil, toStatus(ctx, s.log, "update", err)
			}
			ch.Status = &st
		case "expire_time":
			var exp *time.Time
			if link.ExpireTime != nil {
				t, err := futureTime(link.GetExpireTime())
				if err != nil {
					return nil, toStatus(ctx, s.log, "update", err)
				}
				exp = &t
			}
			ch.Expires = &exp
		case "disabled":
			d := link.GetDisabled()
			ch.Disabled = &d
		case "tags":
			tags, err := normalizeTags(link.GetTags())
			if err != nil {
				return nil, toStatus(ctx, s.log, "update", err)
			}
			ch.Tags = &tags
		case "title":
			title := link.GetTitle()
			if err := checkTitle(title); err != nil {
				return nil, toStatus(ctx, s.log, "update", err)
			}
			ch.Title = &title
		case "max_visits":
			n := link.GetMaxVisits()
			if err := checkMaxVisits(n); err != nil {
				return nil, toStatus(ctx, s.log, "update", err)
			}
			ch.MaxVisits = &n
		case "password":
			pw := link.GetPassword()
			if pw != "" {
				if err := checkPassword(pw); err != nil {
					return nil, toStatus(ctx, s.log, "update", err)
				}
			}
			password = &pw
		case "device_targets":
			t, err := s.normalizeTargets(link.GetDeviceTargets())
			if err != nil {
				return nil, toStatus(ctx, s.log, "update", err)
			}
			ch.Targets = &t
		case "rules", "variants":
			// Validated together below, once both are known.
		default:
			return nil, toStatus(ctx, s.log, "update", rpcerr.Invalidf("update_mask", ReasonUpdateMaskInvalid,
				"update_mask path %q cannot be changed; use %s", p, updatable))
		}
	}
	if err := s.rulesChanges(link, paths, &ch); err != nil {
		return nil, toStatus(ctx, s.log, "update", err)
	}
	key, ok := linkKey(link.GetDomain(), link.GetCode())
	if !linkcode.Plausible(link.GetCode()) || !ok {
		return nil, toStatus(ctx, s.log, "update", linkstore.ErrNotFound)
	}
	var long string
	var t linkstore.DeviceURLs
	if ch.LongURL != nil {
		long = *ch.LongURL
	}
	if ch.Targets != nil {
		t = *ch.Targets
	}
	ds := destinations(long, t, deref(ch.Rules), deref(ch.Variants))
	if domain, _ := linkdomain.Split(key); domain != "" {
		if err := loopOn(domain, ds); err != nil {
			return nil, err
		}
	}
	if refused, err := s.servedLoops(ctx, [][]destination{ds}); err != nil {
		return nil, toStatus(ctx, s.log, "update", err)
	} else if refused[0] != nil {
		return nil, refused[0]
	}
	if ch.LongURL != nil {
		if err := s.scan(ctx, *ch.LongURL); err != nil {
			return nil, toStatus(ctx, s.log, "update", err)
		}
	}
	if ch.Targets != nil {
		if err := s.scanTargets(ctx, *ch.Targets); err != nil {
			return nil, toStatus(ctx, s.log, "update", err)
		}
	}
	if ch.Rules != nil || ch.Variants != nil {
		if err := s.scanRules(ctx, &linkrules.Set{Rules: deref(ch.Rules), Variants: deref(ch.Variants)}); err != nil {
			return nil, toStatus(ctx, s.log, "update", err)
		}
	}
	cond, err := preconditionOf(ctx, link.GetEtag())
	if err != nil {
		return nil, toStatus(ctx, s.log, "update", err)
	}
	// Checked last of what the request says, before the costs of a change
	// (a password hash): a request refused anyway is refused for what it
	// is, not for a stale tag.
	ifVersion, stored, err := s.check(ctx, tenant, key, cond)
	if err != nil {
		return nil, toStatus(ctx, s.log, "update", err)
	}
	ch.IfVersion = ifVersion
	if ch.Disabled != nil && !*ch.Disabled {
		// The blocklist sweep disables a link with this same flag: enabling
		// it must not serve a destination blocked since it was scanned.
		if ifVersion == nil {
			if stored, err = s.store.Get(ctx, tenant, key); err != nil {
				return nil, toStatus(ctx, s.log, "update", err)
			}
		}
		if err := s.scanKept(ctx, stored, ch); err != nil {
			return nil, toStatus(ctx, s.log, "update", err)
		}
	}
	if password != nil {
		hash := ""
		if *password != "" {
			// The slot before the quota, as in CreateLink.
			release, err := s.hashSlot(ctx)
			if err != nil {
				return nil, toStatus(ctx, s.log, "update", err)
			}
			defer release()
			if err := s.checkQuota(ctx, tenant, 1, chargePassword); err != nil {
				return nil, err
			}
			hash, err = hashIn(*password)
			release()
			if err != nil {
				return nil, toStatus(ctx, s.log, "update", err)
			}
		}
		ch.PasswordHash = &hash
	}
	l, err := s.store.Update(ctx, tenant, key, ch)
	if err != nil {
		return nil, toStatus(ctx, s.log, "update", err)
	}
	s.refresh(ctx, "update", l.Code)
	return &shortenerv1.UpdateLinkResponse{Link: s.toProto(l)}, nil
}

// DeleteLink revokes one of the caller's links: its code answers 410 from now
// on (every redirect pod within its L1 TTL at most, once Redis is reachable:
// see refresh), and its visit counter is deleted from Redis.
func (s *Service) DeleteLink(ctx context.Context, req *shortenerv1.DeleteLinkRequest) (*shortenerv1.DeleteLinkResponse, error) {
	tenant, err := s.tenant(ctx)
	if err != nil {
		return nil, err
	}
	key, ok := linkKey(req.GetDomain(), req.GetCode())
	if !linkcode.Plausible(req.GetCode()) || !ok {
		return nil, toStatus(ctx, s.log, "delete", linkstore.ErrNotFound)
	}
	cond, err := preconditionOf(ctx, "")
	if err != nil {
		return nil, toStatus(ctx, s.log, "delete", err)
	}
	ifVersion, _, err := s.check(ctx, tenant, key, cond)
	if err != nil {
		return nil, toStatus(ctx, s.log, "delete", err)
	}
	l, err := s.store.Delete(ctx, tenant, key, ifVersion)
	if err != nil {
		return nil, toStatus(ctx, s.log, "delete", err)
	}
	s.refresh(ctx, "delete", l.Code)
	return &shortenerv1.DeleteLinkResponse{}, nil
}
