// Package redirector is the redirect service's public HTTP handler: GET and
// HEAD /{code} answer 302 (or the link's 301/307/308) with Location, 404 for
// unknown codes, 410 for revoked, disabled or expired links and for the
// links of a suspended tenant (Suspended), 429 when a
// client IP misses too often or looks up too many codes past L1 (WalkBound),
// and 508 when the destination is the host and port asked, a redirect to
// itself (pointsBack).
// Every answer from a lookup carries X-Source: l1, cache or db. Each GET
// redirect records a click event, without waiting.
//
// Links may carry more: per-device targets (iOS, Android, desktop, by
// User-Agent); a visit limit (each GET spends one visit, counted with INCR
// on Redis; past the limit 410, and 503 when Redis cannot count); a password
// (GET shows a form, POST /{code} checks it after the limiter and a CSRF
// token). HEAD requests and link-preview fetchers see a protected link's
// status, never its target, and spend no visit. Redirect rules and A/B-test
// variants (pkg/linkrules) choose the destination after the password and
// visit checks, from the cached entry (see destination); their answers are
// "private, max-age=0" so no shared cache keeps one visitor's choice.
//
// GET and HEAD /{code}+ answer a page naming where the link leads, a
// preview, which records no click and spends no visit (preview.go). GET
// and HEAD / on the default domain redirect to Config.HomeURL when it is
// set; every other path is a 404 page. OriginForm, around all of it,
// refuses (400) a request line that names a host, so that every route
// reads the host of the Host header.
package redirector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"net/netip"
	"net/url"
	"runtime"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/capacity"
	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/clientip"
	"kurz.dev/pkg/guessgate"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/pkg/linkpass"
	"kurz.dev/pkg/linkrules"
	"kurz.dev/pkg/logging"
	"kurz.dev/pkg/quota"
	"kurz.dev/pkg/telemetry"
	"kurz.dev/services/redirect/internal/resolve"
)

// MissDomain is the limiter domain asked (per client IP) before a lookup
// goes to PostgreSQL.
const MissDomain = "redirect.miss"

// Config shapes the answers.
type Config struct {
	// DefaultStatus is used for links without their own redirect type.
	DefaultStatus int
	// CDNMaxAge > 0 makes 302/307 answers "public, max-age=N" so a CDN can
	// absorb a viral link for a few seconds; 0 keeps "private, max-age=0"
	// (every click reaches kurz, revocation is immediate).
	CDNMaxAge time.Duration
	// PermanentMaxAge is the max-age of 301/308 answers, a deliberate choice
	// per link or by configuration. Either max-age ends at the link's
	// expiry when that comes sooner (untilExpiry).
	PermanentMaxAge time.Duration
	// HomeURL, if set, is where a GET of the default domain's root
	// redirects (302; CheckHomeURL); else, and on a custom domain, the
	// root is a 404 page.
	HomeURL string
	// Clients finds each request's client (nil: the TCP peer). Its trusted
	// proxies' X-Forwarded-Proto is believed too.
	Clients *clientip.Policy
	// Keying turns the client address into the key of its limits and its
	// visitor hash: an IPv6 client's whole prefix is one client.
	Keying clientip.Keying
	// VisitorSalt keys the visitor hash of click events.
	VisitorSalt []byte
	// MissPolicy applies when the limiter does not answer on the miss path.
	MissPolicy quota.Policy
	// FormSecret keys the password forms' CSRF tokens; every replica must
	// share it, or a form only verifies on the replica that rendered it.
	FormSecret []byte
	// VisitTimeout bounds one visit counter's round trip to Redis.
	VisitTimeout time.Duration
	// VisitReplicas is how many replicas must hold a counted visit before
	// it is granted (Redis WAIT), so that a failover does not reopen a
	// spent link; 0 for a Redis without replicas.
	VisitReplicas int
	// PasswordChecks bounds the Argon2 verifications running at once
	// (about 19 MiB each); 0 means GOMAXPROCS, at most
	// defaultPasswordChecks (passwordChecks). As many attempts may wait
	// for one, at most passwordWait; the others are refused (503).
	PasswordChecks int
	// WalkRate (per second) and WalkBurst bound the lookups past L1 of one
	// client IP (see WalkBound, CheckWalkBound); past them 429.
	WalkRate  float64
	WalkBurst int
	// Country returns the ISO 3166-1 alpha-2 code of a client address's
	// country, "" when unknown; nil when no GeoIP database is configured.
	Country func(netip.Addr) string
}

// Clicks receives click events; Record must not block.
type Clicks interface {
	Record(clickevent.Event)
}

// Deps are what the handler talks to.
type Deps struct {
	Resolver *resolve.Resolver
	// Quota is asked on the miss path (MissPolicy applies).
	Quota *quota.Client
	// PasswordQuota is asked before each password attempt; the handler
	// fails closed whatever its answer's source.
	PasswordQuota *quota.Client
	// Visits INCRs the counters of visit-limited links. Give it a client
	// that never retries: a retried INCR whose first try went through
	// would spend two visits on one.
	Visits redis.Cmdable
	Clicks Clicks
	// Hosts routes requests by Host header (default domain, custom
	// domains); nil serves every host as the default domain.
	Hosts *Hosts
	// Suspended holds the suspended tenants, whose links answer 410; nil:
	// none.
	Suspended *Suspended
	Log       *slog.Logger
}

// Handler serves short codes.
type Handler struct {
	cfg      Config
	resolver *resolve.Resolver
	quota    *quota.Client
	pwQuota  *quota.Client
	visits   redis.Cmdable
	clicks   Clicks
	hosts    *Hosts
	log      *slog.Logger
	tokens   formTokens
	argon    *capacity.Gate
	visitors *clickevent.Visitors
	sticky   linkrules.Sticky
	requests metric.Int64Counter
	latency  metric.Float64Histogram
	// The Cache-Control values the configuration's max-ages make.
	ccPermanent, ccPrivatePermanent, ccCDN []string
	attempts                               metric.Int64Counter
	walk                                   *WalkBound
	// walkRefused counts lookups the walk bound refused.
	walkRefused metric.Int64Counter
	sets        *telemetry.AttrSets[countKey]
	// visitLogs lets one line a second through about visit counters
	// Redis failed to read or count: an outage fails every visit.
	visitLogs logging.Every
	// noRuleLogs: the same about password attempts no limiter rule
	// bounds, which a stranger can post as fast as it likes.
	noRuleLogs logging.Every
	guesses    *guessgate.Gate
	// suspended: the tenants whose links answer 410.
	suspended *Suspended
	// previews counts the answers to link previews (GET /{code}+) by
	// status, apart from the redirects'.
	previews metric.Int64Counter
}

// defaultPasswordChecks caps the default number of Argon2 checks at once:
// GOMAXPROCS is a node's cores when the pod has no CPU limit, and 19 MiB a
// core on a 32-core node is 608 MiB, over any redirect's memory limit.
const defaultPasswordChecks = 4

// passwordChecks is the number of Argon2 checks run at once: n, or for 0
// GOMAXPROCS, at most defaultPasswordChecks.
func passwordChecks(n int) int {
	if n > 0 {
		return n
	}
	return min(runtime.GOMAXPROCS(0), defaultPasswordChecks)
}

// New builds the handler. It starts no span of its own: the server's HTTP
// middleware (pkg/server) gives each request its server span, which the
// handler annotates and whose context every click event carries.
func New(cfg Config, d Deps, meter metric.Meter) (*Handler, error) {
	if len(cfg.FormSecret) == 0 {
		return nil, errors.New("redirect handler: empty form secret")
	}
	walk, err := NewWalkBound(cfg.WalkRate, cfg.WalkBurst)
	if err != nil {
		return nil, fmt.Errorf("redirect handler: %w", err)
	}
	checks := passwordChecks(cfg.PasswordChecks)
	h := &Handler{cfg: cfg, resolver: d.Resolver, quota: d.Quota, pwQuota: d.PasswordQuota, visits: d.Visits,
		clicks: d.Clicks, hosts: d.Hosts, suspended: d.Suspended, log: d.Log, tokens: formTokens{secret: cfg.FormSecret}, argon: newArgonGate(checks),
		visitors: clickevent.NewVisitors(cfg.VisitorSalt), sticky: linkrules.NewSticky(cfg.VisitorSalt), walk: walk, guesses: guessgate.New(),
		sets:               telemetry.NewAttrSets[countKey](telemetry.SeriesLimit, telemetry.Overflow),
		ccPermanent:        []string{"public, max-age=" + strconv.Itoa(int(cfg.PermanentMaxAge.Seconds()))},
		ccPrivatePermanent: []string{"private, max-age=" + strconv.Itoa(int(cfg.PermanentMaxAge.Seconds()))},
		ccCDN:              []string{"public, max-age=" + strconv.Itoa(int(cfg.CDNMaxAge.Seconds()))}}
	if h.requests, err = meter.Int64Counter("kurz.redirect.requests",
		metric.WithDescription("Short-code requests by answering tier (source: l1, cache, db, none) and HTTP status"),
		metric.WithUnit("{request}")); err != nil {
		return nil, fmt.Errorf("redirect metrics: %w", err)
	}
	if h.latency, err = meter.Float64Histogram("kurz.redirect.duration",
		metric.WithDescription("Time to answer a short-code request, by source"), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)); err != nil {
		return nil, fmt.Errorf("redirect metrics: %w", err)
	}
	if h.attempts, err = meter.Int64Counter("kurz.redirect.password_attempts",
		metric.WithDescription("Password form submissions by outcome: ok, wrong, forged (CSRF token refused), limited, unavailable, busy (every Argon2 slot busy: nothing checked)"),
		metric.WithUnit("{attempt}")); err != nil {
		return nil, fmt.Errorf("redirect metrics: %w", err)
	}
	if h.walkRefused, err = meter.Int64Counter("kurz.redirect.walk.refused",
		metric.WithDescription("Lookups past L1 refused (429) because their client IP looked up more distinct codes than the walk bound allows"),
		metric.WithUnit("{request}")); err != nil {
		return nil, fmt.Errorf("redirect metrics: %w", err)
	}
	if h.previews, err = meter.Int64Counter("kurz.redirect.previews",
		metric.WithDescription("Link previews (GET /{code}+) by HTTP status; they record no click and are not counted in kurz.redirect.requests"),
		metric.WithUnit("{request}")); err != nil {
		return nil, fmt.Errorf("redirect metrics: %w", err)
	}
	return h, nil
}

// Register puts the routes on mux: /{code} for GET and HEAD (and /{code}+,
// its preview, which serveCode tells apart), POST /{code} for password
// forms, 405 for a code's other methods (a PUT or DELETE on a live link is
// not "no such link"; nothing is looked up), and a neutral 404 for every
// other path the service does not own.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /{code}", h.serveCode)
	mux.HandleFunc("POST /{code}", h.serveAttempt)
	mux.HandleFunc("/{code}", func(w http.ResponseWriter, r *http.Request) {
		if c := r.PathValue("code"); !linkcode.Plausible(c) || linkcode.Reserved(c) || r.Method == http.MethodConnect || r.Method == http.MethodTrace {
			page(w, http.StatusNotFound)
			return
		}
		w.Header().Set("Allow", "GET, HEAD, POST")
		page(w, http.StatusMethodNotAllowed)
	})
	mux.HandleFunc("GET /{$}", h.serveHome)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { page(w, http.StatusNotFound) })
}

// serveHome answers a GET of the root: on the default domain, a redirect
// to HomeURL when it is set; a 404 page otherwise. A HomeURL that is this
// root again (the host and port asked, path "/") answers 508, as a link
// to itself does, rather than redirect a browser in a loop.
func (h *Handler) serveHome(w http.ResponseWriter, r *http.Request) {
	if _, tenant, known := h.route(r.Host, ""); h.cfg.HomeURL == "" || !known || tenant != "" {
		page(w, http.StatusNotFound)
		return
	}
	if u, err := url.Parse(h.cfg.HomeURL); err == nil && (u.Path == "" || u.Path == "/") && pointsBack(r.Host, h.cfg.HomeURL) {
		loopPage(w)
		return
	}
	hdr := w.Header()
	hdr["Cache-Control"] = ccPrivate
	hdr["Location"] = []string{h.cfg.HomeURL}
	w.WriteHeader(http.StatusFound)
}

// CheckHomeURL refuses a HomeURL that is not an absolute http(s) URL
// with a host ("" is none).
func CheckHomeURL(raw string) error {
	if raw == "" {
		return nil
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil || len(raw) > maxHomeURL:
		return fmt.Errorf("%q is not a URL of at most %d characters", raw, maxHomeURL)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "", u.User != nil:
		return fmt.Errorf("%q: want an http or https URL with a host and no user name, e.g. https://example.com/", raw)
	case raw != asciiURL(raw):
		return fmt.Errorf("%q: want it with every non-ASCII character percent-encoded, as a Location header carries it", raw)
	}
	return nil
}

// maxHomeURL bounds HomeURL, as the shortener bounds a link's URL.
const maxHomeURL = 2048

var traceContext = propagation.TraceContext{}

func (h *Handler) serveCode(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	code := r.PathValue("code")
	if !linkcode.Plausible(code) {
		if base, ok := previewOf(code); ok {
			h.servePreview(w, r, base, start)
			return
		}
		// Not one of ours: no cache, no database, no limiter.
		h.count(r.Context(), start, "none", http.StatusNotFound)
		page(w, http.StatusNotFound)
		return
	}
	ctx := r.Context()
	key, tenant, known := h.route(r.Host, code)
	if !known {
		// A host that is neither ours nor a verified domain: no lookup.
		h.count(ctx, start, "none", http.StatusNotFound)
		hostPage(w)
		return
	}
	// Annotated only when recorded: the attributes escape into the call,
	// two allocations per request for a span nothing exports.
	span := trace.SpanFromContext(ctx)
	recording := span.IsRecording()
	if recording {
		span.SetAttributes(attribute.String("kurz.code", key))
	}

	addr := h.cfg.Clients.Client(r)
	ip := h.cfg.Keying.Key(addr)
	res, err := h.resolver.Resolve(ctx, key, func(ctx context.Context, tier resolve.Tier) error { return h.gate(ctx, ip, key, tier) })
	if err != nil {
		status := h.refuse(w, err)
		h.count(ctx, start, "none", status)
		return
	}
	w.Header()["X-Source"] = sourceHeader(res.Source)
	if recording {
		span.SetAttributes(attribute.String("kurz.source", string(res.Source)))
	}
	status := h.visit(w, r, link{key: key, code: code}, client{addr, ip}, foreign(res.Entry, tenant), start)
	h.count(ctx, start, string(res.Source), status)
}

// link names the link of a request: its key (pkg/linkdomain: the code on
// the default domain, "<domain>/<code>" on a custom one), which the caches,
// visit counters and click events go by, and the code of the path, which
// the password form's URL and cookie use.
type link struct {
	key, code string
}

// foreign turns the entry of a link on a custom domain into Missing unless
// the link belongs to the tenant holding the domain now (tenant "": the
// default domain, any tenant).
func foreign(e linkcache.Entry, tenant string) linkcache.Entry {
	if tenant != "" && e.State != linkcache.Missing && e.Tenant != tenant {
		return linkcache.Entry{State: linkcache.Missing}
	}
	return e
}

// visit answers a GET or HEAD of code, whose entry is e, and returns the
// status. Ordinary links redirect without any other I/O. A HEAD, or a GET by
// a link-preview fetcher, never reveals a protected link's target nor spends
// a visit. A destination back on the host asked answers 508 before any
// visit is spent or click recorded.
func (h *Handler) visit(w http.ResponseWriter, r *http.Request, lk link, c client, e linkcache.Entry, start time.Time) int {
	code := lk.key
	if status, done := h.inactive(w, e, start); done {
		return status
	}
	ctx := r.Context()
	ua := r.UserAgent()
	look := r.Method == http.MethodHead || (e.MaxVisits > 0 && IsPreviewBot(ua))
	switch {
	case e.PasswordHash != "":
		// The form, for browsers, bots and HEAD alike. If the visits are
		// known to be spent, say so before anyone types a password.
		if h.spent(ctx, code, e) {
			page(w, http.StatusGone)
			return http.StatusGone
		}
		return h.form(w, r, lk.code, http.StatusOK, "")
	}
	// Chosen before the visit is spent: a destination back on this host
	// asks the same link again, and each round would spend a visit and
	// record a click until the client gives up.
	d := h.destination(r, ua, code, c, e, start)
	if pointsBack(r.Host, d.url) {
		return loopPage(w)
	}
	switch {
	case e.MaxVisits > 0 && look:
		left, err := h.visitsLeft(ctx, code, e.MaxVisits)
		if err != nil {
			if n, ok := h.visitLogs.Allow(); ok {
				h.log.WarnContext(ctx, "visit counter unreadable", "code", code, "failures_not_logged", n, "err", err)
			}
			return h.unavailable(w)
		}
		if !left {
			page(w, http.StatusGone)
			return http.StatusGone
		}
		// The status a visit would get, without Location.
		w.Header().Set("Cache-Control", "no-store")
		status := h.status(e)
		w.WriteHeader(status)
		return status
	case e.MaxVisits > 0:
		switch h.countVisit(ctx, code, e) {
		case visitExhausted:
			page(w, http.StatusGone)
			return http.StatusGone
		case visitUncounted:
			return h.unavailable(w)
		}
	}
	status := h.redirect(w, e, d.url, e.MaxVisits > 0, h.status(e))
	if r.Method == http.MethodGet {
		h.record(ctx, r, code, e.Tenant, c, start, d)
	}
	return status
}

// serveAttempt checks a password form: the code (404, 410, and 405 for a
// link without a password), the body, the CSRF token, the visits left (410
// when a visit-limited link has none), then the limiter, then the password
// (503 when every Argon2 slot stays busy); the right one redirects (303,
// the browser GETs the target) and counts as a click and, for a
// visit-limited link, a visit.
func (h *Handler) serveAttempt(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	code := r.PathValue("code")
	ctx := r.Context()
	if !linkcode.Plausible(code) {
		h.count(ctx, start, "none", http.StatusNotFound)
		page(w, http.StatusNotFound)
		return
	}
	lk, c, e, source, status := h.lookup(w, r, code)
	if status == 0 {
		status = h.attempt(w, r, lk, c, e, start)
	}
	h.count(ctx, start, source, status)
}

// readForm reads a POST's form (bounded) and returns 0, or the status that
// refuses it.
func readForm(w http.ResponseWriter, r *http.Request) int {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct != "application/x-www-form-urlencoded" {
		return http.StatusUnsupportedMediaType
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return http.StatusRequestEntityTooLarge
		}
		return http.StatusBadRequest
	}
	return 0
}

func (h *Handler) attempt(w http.ResponseWriter, r *http.Request, lk link, c client, e linkcache.Entry, start time.Time) int {
	code, ip := lk.key, c.key
	if status, done := h.inactive(w, e, start); done {
		return status
	}
	ctx := r.Context()
	if e.PasswordHash == "" {
		w.Header().Set("Allow", "GET, HEAD")
		page(w, http.StatusMethodNotAllowed)
		return http.StatusMethodNotAllowed
	}
	if status := readForm(w, r); status != 0 {
		page(w, status)
		return status
	}
	outcome := func(o string) {
		h.attempts.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", o)))
	}
	var nonce string
	if c, err := r.Cookie(formCookie); err == nil {
		nonce = c.Value
	}
	if err := h.tokens.check(lk.code, nonce, r.PostForm.Get(formField), start); err != nil {
		// Counted, logged only at debug: anyone may post forms, and a
		// refusal costs no limiter check, so a line each would let a
		// stranger fill the log at will.
		outcome("forged")
		h.log.DebugContext(ctx, "password form refused", "code", code, "reason", err.Error())
		return h.form(w, r, lk.code, http.StatusForbidden, msgForged)
	}
	// A link whose visits are spent answers 410 as its GET does, before
	// the limiter and the hash: a form kept from before its last visit
	// could otherwise still tell a right password from a wrong one (410
	// against 401), each answer an Argon2 check.
	if h.spent(ctx, code, e) {
		page(w, http.StatusGone)
		return http.StatusGone
	}
	// The limiter before the hash: every attempt is charged to the Argon2
	// work its address, and its network, may cause; wrong guesses are
	// looked at here and counted after the hash, so right passwords do not
	// use them up.
	d := h.pwQuota.Check(ctx, PasswordDomain, map[string]string{"ip": ip, "net": netKey(c.addr), "code": code}, 1, quota.FailClosed)
	h.warnNoRule(ctx, PasswordDomain, code, d)
	if status, refused := h.passwordRefused(w, r, lk.code, d, outcome); refused {
		return status
	}
	desc := map[string]string{"ip": ip, "code": code}
	var g quota.Decision
	guess, err := h.guesses.Admit(ctx, ip+"\x00"+code, func() (int64, error) {
		g = h.pwQuota.Peek(ctx, PasswordGuessDomain, desc, quota.FailClosed)
		h.warnNoRule(ctx, PasswordGuessDomain, code, g)
		switch {
		case !g.Allowed || g.Abandoned:
			return 0, errGuessRefused
		case g.Rule == "":
			return guessgate.Unlimited, nil
		case g.Remaining <= 0: // a look at a rule with nothing left
			g.Allowed = false
			return 0, errGuessRefused
		}
		return g.Remaining, nil
	})
	switch {
	case errors.Is(err, errGuessRefused):
		status, _ := h.passwordRefused(w, r, lk.code, g, outcome)
		return status
	case err != nil: // failures the limiter did not count used up what was left, or the visitor left
		outcome("limited")
		w.Header().Set("Retry-After", "1")
		return h.form(w, r, lk.code, http.StatusTooManyRequests, msgTooMany)
	}
	defer guess.Done()
	ok, err := h.verify(ctx, e.PasswordHash, r.PostForm.Get("password"))
	switch {
	case errors.Is(err, linkpass.ErrMalformed):
		h.log.ErrorContext(ctx, "stored password hash is malformed", "code", code)
		page(w, http.StatusInternalServerError)
		return http.StatusInternalServerError
	case errors.Is(err, capacity.ErrBusy):
		// Charged to links.password (which bounds a flood of them) but
		// not a guess: nothing was checked.
		outcome("busy")
		w.Header().Set("Retry-After", "1")
		return h.form(w, r, lk.code, http.StatusServiceUnavailable, msgBusy)
	case err != nil:
		outcome("unavailable")
		return h.unavailable(w)
	case !ok:
		outcome("wrong")
		// Counted even if the client hangs up meanwhile: one that
		// half-closes still reads its 401, and must not guess for free.
		// A guess the limiter did not count counts here against the
		// attempts in flight, and the next look fails closed as long
		// as the limiter does not answer.
		g := h.pwQuota.Check(context.WithoutCancel(ctx), PasswordGuessDomain, desc, 1, quota.FailClosed)
		guess.Fail(!g.Unchecked())
		return h.form(w, r, lk.code, http.StatusUnauthorized, msgWrong)
	}
	outcome("ok")
	dest := h.destination(r, r.UserAgent(), code, c, e, start)
	if pointsBack(r.Host, dest.url) {
		return loopPage(w)
	}
	if e.MaxVisits > 0 {
		switch h.countVisit(ctx, code, e) {
		case visitExhausted:
			page(w, http.StatusGone)
			return http.StatusGone
		case visitUncounted:
			return h.unavailable(w)
		}
	}
	// The nonce has served; the next form gets a new one.
	http.SetCookie(w, &http.Cookie{Name: formCookie, Path: "/" + lk.code, MaxAge: -1, HttpOnly: true,
		Secure: h.secure(r), SameSite: http.SameSiteStrictMode})
	// 303 whatever the link's type: the browser follows with a GET, where
	// a 307/308 would re-post the form, password included, to the target.
	status := h.redirect(w, e, dest.url, true, http.StatusSeeOther)
	h.record(ctx, r, code, e.Tenant, c, start, dest)
	return status
}

// warnNoRule logs, one line a second at most, that no limiter rule of
// domain bounds password attempts: they are let through unbounded.
func (h *Handler) warnNoRule(ctx context.Context, domain, code string, d quota.Decision) {
	if d.Source == ratelimitv1.DecisionSource_DECISION_SOURCE_NO_RULE && d.Allowed {
		if n, ok := h.noRuleLogs.Allow(); ok {
			h.log.WarnContext(ctx, "no limiter rule for password attempts: add one to domain "+domain, "code", code, "attempts_not_logged", n)
		}
	}
}

// passwordRefused answers a password attempt the limiter's decision d
// refuses (429, or 503 when the limiter did not answer) and reports
// whether it did.
func (h *Handler) passwordRefused(w http.ResponseWriter, r *http.Request, code string, d quota.Decision, outcome func(string)) (int, bool) {
	if d.Allowed && !d.Abandoned {
		return 0, false
	}
	if d.Degraded && !d.Abandoned {
		outcome("unavailable")
		w.Header().Set("Retry-After", "1")
		return h.form(w, r, code, http.StatusServiceUnavailable, msgUnavailable), true
	}
	outcome("limited")
	w.Header().Set("Retry-After", retryAfter(d.RetryAfter))
	return h.form(w, r, code, http.StatusTooManyRequests, msgTooMany), true
}

// inactive answers an entry that does not redirect (404, 410) and reports
// whether it did. A suspended tenant's link answers exactly as a disabled
// one: 410 with the same page, which says nothing of why (the tenant may
// be the abuser, or a victim of a stolen key), is kept by no cache
// (private, max-age=0), so a resume takes effect as soon as the set
// changes, and, like every answer here, records no click and spends no
// visit. Not 451: that is a legal demand, which a suspension for abuse
// mostly is not.
func (h *Handler) inactive(w http.ResponseWriter, e linkcache.Entry, now time.Time) (int, bool) {
	switch {
	case e.State == linkcache.Missing:
		page(w, http.StatusNotFound)
		return http.StatusNotFound, true
	case e.State == linkcache.Gone || e.Expired(now) || h.suspended.Has(e.Tenant):
		page(w, http.StatusGone)
		return http.StatusGone, true
	}
	return 0, false
}

// status is the redirect status of an active entry.
func (h *Handler) status(e linkcache.Entry) int {
	if e.Status != 0 {
		return e.Status
	}
	return h.cfg.DefaultStatus
}

// redirect writes a redirect to target and returns its status. noStore
// answers of protected links (visit-limited, or after a password) must not
// be kept by any cache, or a later visit would bypass the count or the
// password; per-device answers are cached only by the device's own browser.
func (h *Handler) redirect(w http.ResponseWriter, e linkcache.Entry, target string, noStore bool, status int) int {
	hdr := w.Header()
	permanent := status == http.StatusMovedPermanently || status == http.StatusPermanentRedirect
	switch {
	case noStore:
		hdr["Cache-Control"] = ccNoStore
	case e.Rules != nil:
		// Rules and variants answer each visitor on their own: no shared
		// cache may keep one visitor's answer, nor the visitor's browser
		// past a rule's time window. Device targets answer when no rule
		// does, so they vary the answer too.
		if v := e.Rules.Vary(e.Targets != nil); v != nil {
			hdr["Vary"] = v // shared, computed once per entry
		}
		hdr["Cache-Control"] = ccPrivate
	case e.Targets != nil:
		hdr["Vary"] = varyUserAgent
		if permanent {
			hdr["Cache-Control"] = untilExpiry(h.ccPrivatePermanent, "private", h.cfg.PermanentMaxAge, e.ExpiresAtMs, time.Now)
		} else {
			hdr["Cache-Control"] = ccPrivate
		}
	case permanent:
		hdr["Cache-Control"] = untilExpiry(h.ccPermanent, "public", h.cfg.PermanentMaxAge, e.ExpiresAtMs, time.Now)
	case h.cfg.CDNMaxAge > 0:
		hdr["Cache-Control"] = untilExpiry(h.ccCDN, "public", h.cfg.CDNMaxAge, e.ExpiresAtMs, time.Now)
	default:
		hdr["Cache-Control"] = ccPrivate
	}
	hdr["Location"] = []string{asciiURL(target)}
	w.WriteHeader(status)
	return status
}

// asciiURL is u with every byte over 0x7F percent-encoded: a URL stored
// before the shortener escaped them keeps non-ASCII characters of its
// query as written (it escaped only what could end or reorder it), and a
// Location header must be a URI, which clients otherwise read in an
// encoding of their own (Latin-1). A URL of ASCII, nearly every one, is returned as it is.
func asciiURL(u string) string {
	i := 0
	for i < len(u) && u[i] < utf8.RuneSelf {
		i++
	}
	if i == len(u) {
		return u
	}
	const hexDigits = "0123456789ABCDEF"
	b := make([]byte, 0, len(u)+16)
	b = append(b, u[:i]...)
	for ; i < len(u); i++ {
		if c := u[i]; c >= utf8.RuneSelf {
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}

// untilExpiry is the Cache-Control value of a cacheable redirect: cc, the
// shared "<scope>, max-age=<maxAge>", unless its link (expiring at
// expiresAtMs, Unix ms; 0 never) expires sooner. Then max-age is the whole
// seconds left, rounded down, so no cache keeps the redirect past the
// expiry, and with less than a second left it is "no-store": max-age=0
// would still let a cache store the redirect and serve it stale (RFC 9111
// allows that when it cannot reach kurz, and CDNs offer it), after the
// link answers 410. Only such links allocate, and only they read now.
func untilExpiry(cc []string, scope string, maxAge time.Duration, expiresAtMs int64, now func() time.Time) []string {
	if expiresAtMs == 0 {
		return cc
	}
	left := (expiresAtMs - now().UnixMilli()) / 1000
	switch {
	case left >= int64(maxAge/time.Second):
		return cc
	case left < 1:
		return ccNoStore
	}
	return []string{scope + ", max-age=" + strconv.FormatInt(left, 10)}
}

// Header values shared by every response that carries them (net/http only
// reads a header's values): building each per request was an allocation
// and a key canonicalisation per header.
var (
	ccNoStore     = []string{"no-store"}
	ccPrivate     = []string{"private, max-age=0"}
	varyUserAgent = []string{"User-Agent"}
	sourceHeaders = map[resolve.Source][]string{
		resolve.SourceL1: {string(resolve.SourceL1)}, resolve.SourceCache: {string(resolve.SourceCache)}, resolve.SourceDB: {string(resolve.SourceDB)},
	}
)

// sourceHeader is the X-Source value of a tier.
func sourceHeader(s resolve.Source) []string {
	if v, ok := sourceHeaders[s]; ok {
		return v
	}
	return []string{string(s)}
}

// record appends the click of a redirect, without waiting.
func (h *Handler) record(ctx context.Context, r *http.Request, code, tenant string, c client, start time.Time, d destination) {
	var parent string
	if trace.SpanContextFromContext(ctx).IsValid() {
		carrier := propagation.MapCarrier{}
		traceContext.Inject(ctx, carrier)
		parent = carrier.Get("traceparent")
	}
	ua := r.UserAgent()
	h.clicks.Record(clickevent.Event{
		ID: clickevent.NewID(start), Code: code, Tenant: tenant, Time: start,
		Visitor:   h.visitors.Visitor(start, c.key, ua),
		UserAgent: clickevent.Truncate(ua), Referrer: clickevent.Truncate(r.Referer()), TraceParent: parent, Country: h.clickCountry(c, d),
		Rule: d.rule, Variant: d.variant,
	})
}

// country is the country of the client address addr, "" without a GeoIP
// database (which then costs nothing).
func (h *Handler) country(addr netip.Addr) string {
	if h.cfg.Country == nil {
		return ""
	}
	return h.cfg.Country(addr)
}

// clickCountry is the country of a click's client: the one a rule's
// country condition looked up, else a lookup of its own.
func (h *Handler) clickCountry(c client, d destination) string {
	if d.countryKnown {
		return d.country
	}
	return h.country(c.addr)
}

// unavailable answers 503 with Retry-After: 1.
func (h *Handler) unavailable(w http.ResponseWriter) int {
	w.Header().Set("Retry-After", "1")
	page(w, http.StatusServiceUnavailable)
	return http.StatusServiceUnavailable
}

func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}

// refuse answers a lookup that did not complete and returns the status.
func (h *Handler) refuse(w http.ResponseWriter, err error) int {
	var d *resolve.Denied
	if errors.As(err, &d) {
		status := http.StatusTooManyRequests
		if d.Unavailable {
			status = http.StatusServiceUnavailable
		}
		w.Header().Set("Retry-After", retryAfter(d.RetryAfter))
		page(w, status)
		return status
	}
	return h.unavailable(w)
}

// gate bounds lookups past L1 per client IP: the walk bound (in process)
// before Redis, the limiter before PostgreSQL. L1 hits, which popular codes
// are, pay for neither; only unknown (uncached) codes pay a limiter call.
func (h *Handler) gate(ctx context.Context, ip, code string, tier resolve.Tier) error {
	if tier == resolve.TierCache {
		if wait := h.walk.Allow(ip, code, time.Now()); wait > 0 {
			h.walkRefused.Add(ctx, 1)
			return &resolve.Denied{RetryAfter: wait}
		}
		return nil
	}
	d := h.quota.Check(ctx, MissDomain, map[string]string{"ip": ip}, 1, h.cfg.MissPolicy)
	switch {
	case d.Abandoned:
		// The client hung up (or half-closed: it still reads): it gets
		// nothing past the limit it did not wait for.
		return &resolve.Denied{RetryAfter: time.Second}
	case d.Allowed:
		return nil
	case d.Degraded:
		return &resolve.Denied{RetryAfter: time.Second, Unavailable: true}
	}
	return &resolve.Denied{RetryAfter: d.RetryAfter}
}

// client is a request's client: its address (pkg/clientip) and the key of
// its limits and visitor hash.
type client struct {
	addr netip.Addr
	key  string
}

func (h *Handler) count(ctx context.Context, start time.Time, source string, status int) {
	h.requests.Add(ctx, 1, h.attrs(source, status).Add...)
	h.latency.Record(ctx, time.Since(start).Seconds(), h.attrs(source, 0).Record...)
}

type countKey struct {
	source string
	status int
}

// attrs returns the attribute set of a source and status (0: the source
// alone), built once: hashing a new set per request cost ~6% of the hot
// path's CPU. Sources and statuses are few and fixed by the handler.
func (h *Handler) attrs(source string, status int) telemetry.Opts {
	return h.sets.Get(countKey{source, status}, func() []attribute.KeyValue {
		kv := []attribute.KeyValue{attribute.String("source", source)}
		if status != 0 {
			kv = append(kv, attribute.Int("status", status))
		}
		return kv
	})
}

// The pages reflect nothing from the request.
var pages = map[int]string{
	http.StatusBadRequest:            "The form could not be read.",
	http.StatusMethodNotAllowed:      "This short link answers GET and HEAD (and POST, for a password).",
	http.StatusRequestEntityTooLarge: "The form is too large.",
	http.StatusUnsupportedMediaType:  "The form must be sent as application/x-www-form-urlencoded.",
	http.StatusInternalServerError:   "Something went wrong on our side. Please try again later.",
	http.StatusNotFound:              "This short link does not exist.",
	statusUnknownHost:                "This domain does not serve short links.",
	statusAbsoluteForm:               "This request names a host in its request line. Send the path alone, with the host in the Host header.",
	http.StatusLoopDetected:          "This short link leads back to this site, in a loop: it cannot be followed.",
	http.StatusGone:                  "This short link is no longer available.",
	http.StatusTooManyRequests:       "Too many requests. Please wait a moment and try again.",
	http.StatusServiceUnavailable:    "This service is temporarily unavailable. Please try again shortly.",
}

// statusUnknownHost keys the page of a host kurz does not serve (a 404).
const statusUnknownHost = 1404

// statusAbsoluteForm keys the page of a request line naming a host (a
// 400, OriginForm).
const statusAbsoluteForm = 1400

// hostPage answers a request for a host that is neither one of kurz's own
// nor a verified custom domain: 404, saying so.
func hostPage(w http.ResponseWriter) {
	writePage(w, http.StatusNotFound, pages[statusUnknownHost])
}

func page(w http.ResponseWriter, status int) {
	writePage(w, status, pages[status])
}

func writePage(w http.ResponseWriter, status int, msg string) {
	hdr := w.Header()
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	hdr.Set("Cache-Control", "private, max-age=0")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Content-Security-Policy", "default-src 'none'")
	w.WriteHeader(status)
	fmt.Fprintf(w, "<!doctype html><meta charset=utf-8><title>%d %s</title><p>%s</p>\n",
		status, http.StatusText(status), msg)
}
