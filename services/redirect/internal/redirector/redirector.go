// Package redirector is the redirect service's public HTTP handler: GET and
// HEAD /{code} answer 302 (or the link's 301/307/308) with Location, 404 for
// unknown codes, 410 for revoked, disabled or expired links, and 429 when a
// client IP misses too often. Every answer from a lookup carries X-Source:
// l1, cache or db. Each GET redirect records a click event, without waiting.
package redirector

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/pkg/quota"
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
	// per link or by configuration.
	PermanentMaxAge time.Duration
	// ClientIPHeader names a header set by a trusted proxy in front of the
	// service (X-Forwarded-For: its last entry is used). Empty: the peer
	// address.
	ClientIPHeader string
	// VisitorSalt keys the visitor hash of click events.
	VisitorSalt []byte
	// MissPolicy applies when the limiter does not answer.
	MissPolicy quota.Policy
}

// Clicks receives click events; Record must not block.
type Clicks interface {
	Record(clickevent.Event)
}

// Handler serves short codes.
type Handler struct {
	cfg      Config
	resolver *resolve.Resolver
	quota    *quota.Client
	clicks   Clicks
	requests metric.Int64Counter
	latency  metric.Float64Histogram
}

// New builds the handler. It starts no span of its own: the server's HTTP
// middleware (pkg/server) gives each request its server span, which the
// handler annotates and whose context every click event carries.
func New(cfg Config, r *resolve.Resolver, q *quota.Client, clicks Clicks, meter metric.Meter) (*Handler, error) {
	h := &Handler{cfg: cfg, resolver: r, quota: q, clicks: clicks}
	var err error
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
	return h, nil
}

// Register puts the routes on mux: /{code} for GET and HEAD, and a neutral
// 404 for every other path the service does not own.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /{code}", h.serveCode)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { page(w, http.StatusNotFound) })
}

var traceContext = propagation.TraceContext{}

func (h *Handler) serveCode(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	code := r.PathValue("code")
	if !linkcode.Plausible(code) {
		// Not one of ours: no cache, no database, no limiter.
		h.count(r.Context(), start, "none", http.StatusNotFound)
		page(w, http.StatusNotFound)
		return
	}
	ctx := r.Context()
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(attribute.String("kurz.code", code))

	ip := h.clientIP(r)
	res, err := h.resolver.Resolve(ctx, code, func(ctx context.Context) error { return h.gate(ctx, ip) })
	if err != nil {
		status := h.refuse(w, err)
		h.count(ctx, start, "none", status)
		return
	}
	w.Header().Set("X-Source", string(res.Source))
	status := h.answer(w, res.Entry, start)
	span.SetAttributes(attribute.String("kurz.source", string(res.Source)))
	h.count(ctx, start, string(res.Source), status)
	if status < 300 || status > 399 || r.Method != http.MethodGet {
		return
	}
	carrier := propagation.MapCarrier{}
	traceContext.Inject(ctx, carrier)
	ua := r.UserAgent()
	h.clicks.Record(clickevent.Event{
		ID: clickevent.NewID(start), Code: code, Tenant: res.Entry.Tenant, Time: start,
		Visitor:   clickevent.Visitor(h.cfg.VisitorSalt, start, ip, ua),
		UserAgent: ua, Referrer: r.Referer(), TraceParent: carrier.Get("traceparent"),
	})
}

// answer writes the response for an entry and returns its status.
func (h *Handler) answer(w http.ResponseWriter, e linkcache.Entry, now time.Time) int {
	switch {
	case e.State == linkcache.Missing:
		page(w, http.StatusNotFound)
		return http.StatusNotFound
	case e.State == linkcache.Gone || e.Expired(now):
		page(w, http.StatusGone)
		return http.StatusGone
	}
	status := e.Status
	if status == 0 {
		status = h.cfg.DefaultStatus
	}
	switch status {
	case http.StatusMovedPermanently, http.StatusPermanentRedirect:
		w.Header().Set("Cache-Control", fmt.Sprintf("public, max-age=%d", int(h.cfg.PermanentMaxAge.Seconds())))
	default:
		if h.cfg.CDNMaxAge > 0 {
			w.Header().Set("Cache-Control", fmt.Sprintf("public, max-age=%d", int(h.cfg.CDNMaxAge.Seconds())))
		} else {
			w.Header().Set("Cache-Control", "private, max-age=0")
		}
	}
	w.Header().Set("Location", e.URL)
	w.WriteHeader(status)
	return status
}

// refuse answers a lookup that did not complete and returns the status.
func (h *Handler) refuse(w http.ResponseWriter, err error) int {
	var d *resolve.Denied
	if errors.As(err, &d) {
		status := http.StatusTooManyRequests
		if d.Unavailable {
			status = http.StatusServiceUnavailable
		}
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(d.RetryAfter.Seconds())))))
		page(w, status)
		return status
	}
	w.Header().Set("Retry-After", "1")
	page(w, http.StatusServiceUnavailable)
	return http.StatusServiceUnavailable
}

// gate asks the limiter before a PostgreSQL lookup: only unknown (uncached)
// codes pay for rate limiting.
func (h *Handler) gate(ctx context.Context, ip string) error {
	d := h.quota.Check(ctx, MissDomain, map[string]string{"ip": ip}, 1, h.cfg.MissPolicy)
	switch {
	case d.Allowed:
		return nil
	case d.Degraded:
		return &resolve.Denied{RetryAfter: time.Second, Unavailable: true}
	}
	return &resolve.Denied{RetryAfter: d.RetryAfter}
}

func (h *Handler) clientIP(r *http.Request) string {
	if h.cfg.ClientIPHeader != "" {
		v := r.Header.Values(h.cfg.ClientIPHeader)
		if len(v) > 0 {
			last := v[len(v)-1]
			if i := strings.LastIndexByte(last, ','); i >= 0 {
				last = last[i+1:]
			}
			if ip := net.ParseIP(strings.TrimSpace(last)); ip != nil {
				return ip.String()
			}
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func (h *Handler) count(ctx context.Context, start time.Time, source string, status int) {
	h.requests.Add(ctx, 1, metric.WithAttributes(attribute.String("source", source), attribute.Int("status", status)))
	h.latency.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attribute.String("source", source)))
}

// The pages reflect nothing from the request.
var pages = map[int]string{
	http.StatusNotFound:           "This short link does not exist.",
	http.StatusGone:               "This short link is no longer available.",
	http.StatusTooManyRequests:    "Too many requests. Please wait a moment and try again.",
	http.StatusServiceUnavailable: "This service is temporarily unavailable. Please try again shortly.",
}

func page(w http.ResponseWriter, status int) {
	hdr := w.Header()
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	hdr.Set("Cache-Control", "private, max-age=0")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Content-Security-Policy", "default-src 'none'")
	w.WriteHeader(status)
	fmt.Fprintf(w, "<!doctype html><meta charset=utf-8><title>%d %s</title><p>%s</p>\n",
		status, http.StatusText(status), pages[status])
}
