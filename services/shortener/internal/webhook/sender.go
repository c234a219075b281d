package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"kurz.dev/pkg/linkdomain"
	"kurz.dev/pkg/webhooksig"
)

const (
	// maxBody bounds the body of one delivery; a bigger one is dead at once.
	maxBody = 1 << 20
	// maxAnswer bounds what is read of a receiver's answer (then dropped).
	maxAnswer = 4 << 10
	// maxErrorText bounds the answer's start kept in last_error.
	maxErrorText = 200
	// pruneEvery is how often finished deliveries past the retention, or
	// past the KeepFinished of their subscription, go.
	pruneEvery = 10 * time.Minute
	// purgeEvery is how often deleted subscriptions' deliveries go (they
	// are neither sent nor counted meanwhile).
	purgeEvery = time.Minute
	// userAgent names the sender to receivers.
	userAgent = "kurz-webhooks/1"
)

// Sender sends due deliveries: whenever it has a free slot (at most
// Concurrency in flight, ConcurrencyPerSubscription per subscription and
// ConcurrencyPerTenant per tenant) it
// claims due deliveries to fill them, POSTs each and records the outcome;
// with nothing due it waits PollInterval or until a slot frees.
type Sender struct {
	cfg    Config
	store  *Store
	sealer *Sealer
	client *http.Client
	// allowHTTP: plain http:// receivers may be sent to (Targets.AllowHTTP).
	allowHTTP bool
	baseURL   string
	log       *slog.Logger
	now       func() time.Time
	sent      metric.Int64Counter

	// mu guards sending, what Run sends now (nil maps while it does not
	// run), which the lag gauge leaves out when at a limit.
	mu      sync.Mutex
	sending inFlight
}

// NewSender returns a Sender; baseURL prefixes the short URLs in events.
func NewSender(cfg Config, store *Store, sealer *Sealer, targets Targets, baseURL string, log *slog.Logger, meter metric.Meter) (*Sender, error) {
	cfg.ConcurrencyPerTenant = min(cfg.ConcurrencyPerTenant, cfg.Concurrency)
	cfg.ConcurrencyPerSubscription = min(cfg.ConcurrencyPerSubscription, cfg.ConcurrencyPerTenant)
	s := &Sender{cfg: cfg, store: store, sealer: sealer, client: targets.Client(cfg.Timeout), allowHTTP: targets.AllowHTTP, baseURL: baseURL, log: log, now: time.Now}
	var errs [4]error
	s.sent, errs[0] = meter.Int64Counter("kurz.shortener.webhook.attempts",
		metric.WithDescription("Webhook delivery attempts, by outcome: succeeded, retry (failed, attempted again later) or dead (failed for good, until redelivered)"),
		metric.WithUnit("{attempt}"))
	pending, err1 := meter.Int64ObservableGauge("kurz.shortener.webhook.queue.pending",
		metric.WithDescription("Webhook deliveries not delivered yet (due now, or waiting for a retry)"), metric.WithUnit("{delivery}"))
	oldest, err2 := meter.Float64ObservableGauge("kurz.shortener.webhook.queue.oldest_age",
		metric.WithDescription("How long the oldest pending webhook delivery has been queued (0: none)"), metric.WithUnit("s"))
	lag, err3 := meter.Float64ObservableGauge("kurz.shortener.webhook.queue.lag",
		metric.WithDescription("How long the most overdue webhook delivery that this replica could claim now (its subscription and tenant below their concurrency limits here) has been due without an attempt (0: none; only replicas that send report it); growing means no sender keeps up"),
		metric.WithUnit("s"))
	errs[1] = errors.Join(err1, err2, err3)
	if errs[1] == nil {
		_, errs[2] = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
			s.mu.Lock()
			sending, running := s.sending.clone(), s.sending.subs != nil
			s.mu.Unlock()
			n, age, late, err := store.QueueStats(ctx, sending, s.limits())
			if err != nil {
				return err
			}
			o.ObserveInt64(pending, n)
			o.ObserveFloat64(oldest, age.Seconds())
			// Only a sender knows what its limits hold back; a replica
			// that does not send would count it as stalled.
			if running {
				o.ObserveFloat64(lag, late.Seconds())
			}
			return nil
		}, pending, oldest, lag)
	}
	// Its own callback: the subscriptions are counted in a statement of
	// their own, which a queue too large for QueueStats does not hold up.
	backlogged, err := meter.Int64ObservableGauge("kurz.shortener.webhook.backlogged_subscriptions",
		metric.WithDescription("Webhook subscriptions with KURZ_SHORTENER_WEBHOOK_MAX_PENDING pending deliveries, not queued link events until their backlog goes down (those events are lost to them)"),
		metric.WithUnit("{subscription}"))
	errs[3] = err
	if err == nil {
		_, errs[3] = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
			n, err := store.BackloggedSubscriptions(ctx)
			if err != nil {
				return err
			}
			o.ObserveInt64(backlogged, n)
			return nil
		}, backlogged)
	}
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("webhook metrics: %w", err)
	}
	return s, nil
}

// limits are the most deliveries of one subscription and one tenant Run
// sends at once.
func (s *Sender) limits() claimLimits {
	return claimLimits{perSub: s.cfg.ConcurrencyPerSubscription, perTenant: s.cfg.ConcurrencyPerTenant}
}

// lease is how long a claimed delivery is held: past the attempt's own
// bound, so a live sender always finishes first.
func (s *Sender) lease() time.Duration { return 2*s.cfg.Timeout + 5*time.Second }

// Run sends until ctx ends. In-flight attempts are cancelled then; their
// deliveries are due again once their lease passes.
func (s *Sender) Run(ctx context.Context) {
	tick := time.NewTicker(s.cfg.PollInterval)
	defer tick.Stop()
	var (
		wg    sync.WaitGroup
		mu    = &s.mu
		freed = make(chan struct{}, 1)
	)
	mu.Lock()
	s.sending = newInFlight()
	sending := s.sending
	mu.Unlock()
	defer func() {
		wg.Wait()
		mu.Lock()
		s.sending = inFlight{}
		mu.Unlock()
	}()
	wg.Go(func() { s.housekeep(ctx) })
	wg.Go(func() { s.watchBacklogs(ctx) })
	limits := s.limits()
	failing := false // the last claim failed: logged once, until one succeeds
	for ctx.Err() == nil {
		// A copy of the counts to claim with: deliveries that finish
		// meanwhile only make it claim less than it could.
		mu.Lock()
		held := sending.clone()
		mu.Unlock()
		free := s.cfg.Concurrency - held.total()
		var batch []claim
		var err error
		if free > 0 {
			batch, err = s.store.Claim(ctx, free, s.lease(), limits, held)
			mu.Lock()
			for _, c := range batch {
				sending.add(c, 1)
			}
			mu.Unlock()
		}
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			s.log.Warn("webhook deliveries: claim failed; retrying every poll interval", "err", err)
			failing = true
		case err == nil && free > 0 && failing:
			s.log.Info("webhook deliveries: claiming again")
			failing = false
		}
		claimed := len(batch)
		for _, c := range batch {
			wg.Go(func() {
				s.deliver(ctx, c)
				mu.Lock()
				sending.add(c, -1)
				mu.Unlock()
				select {
				case freed <- struct{}{}:
				default:
				}
			})
		}
		if claimed > 0 && claimed == free {
			continue // maybe more is due: claim again once a slot frees
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		case <-freed:
		}
	}
}

// housekeep deletes, until ctx ends, the deliveries of deleted
// subscriptions (and then their rows) every purgeEvery, and every
// pruneEvery the finished deliveries past the retention and those past the
// newest KeepFinished of each subscription, and during a key rotation
// seals the secrets under the new key, beside the claims: a long
// purge (a busy subscription's log) does not hold up the sending.
func (s *Sender) housekeep(ctx context.Context) {
	tick := time.NewTicker(purgeEvery)
	defer tick.Stop()
	var lastPrune time.Time
	for ctx.Err() == nil {
		if n, err := s.store.PurgeDeleted(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("webhook deliveries: purging deleted subscriptions failed", "err", err)
		} else if n > 0 {
			s.log.Info("deleted webhook subscriptions purged", "subscriptions", n)
		}
		if time.Since(lastPrune) >= pruneEvery {
			lastPrune = time.Now()
			if n, err := s.store.Prune(ctx, s.now().Add(-s.cfg.Retention)); err != nil && ctx.Err() == nil {
				s.log.Warn("webhook deliveries: prune failed", "err", err)
			} else if n > 0 {
				s.log.Info("webhook deliveries pruned", "deleted", n)
			}
			if n, err := s.store.TrimFinished(ctx, s.cfg.KeepFinished); err != nil && ctx.Err() == nil {
				s.log.Warn("webhook deliveries: trimming to the kept failed", "err", err)
			} else if n > 0 {
				s.log.Info("webhook deliveries past the kept trimmed", "deleted", n, "kept", s.cfg.KeepFinished)
			}
			if s.sealer.Rotating() {
				s.reseal(ctx)
			}
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// reseal makes one rotation pass (Store.Reseal) and says how it went: an
// operator removes KURZ_SHORTENER_WEBHOOK_PREVIOUS_KEY once a pass that
// started after every replica ran with the new key has left nothing
// (secrets still created under the old key meanwhile move on a later pass).
func (s *Sender) reseal(ctx context.Context) {
	n, unopened, err := s.store.Reseal(ctx, s.sealer)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("webhook secrets: sealing under the new key failed; the next pass goes on", "sealed_again", n, "err", err)
		}
		return
	}
	s.log.Info("webhook secrets sealed under the new key", "sealed_again", n, "opened_by_neither_key", unopened)
}

// deliver makes one attempt of c and records how it went. An attempt cut
// by the sender's own shutdown is not recorded: the lease brings it back.
func (s *Sender) deliver(ctx context.Context, c claim) {
	o := s.attempt(ctx, c)
	if ctx.Err() != nil {
		return
	}
	result := "succeeded"
	if o.err != "" {
		o.dead = c.Attempts >= s.cfg.MaxAttempts || o.dead
		o.wait = s.backoff(c.Attempts)
		if !o.dead && s.now().Add(o.wait).After(c.Queued.Add(s.cfg.RetryWindow)) {
			o.dead = true
		}
		result = "retry"
		attrs := []any{"id", c.ID, "subscription", c.SubscriptionID, "tenant", c.Tenant, "attempts", c.Attempts, "err", o.err}
		if o.cause != nil {
			attrs = append(attrs, "cause", o.cause)
		}
		if o.dead {
			result = "dead"
			o.wait = 0
			s.log.Warn("webhook delivery dead", attrs...)
		} else {
			s.log.Debug("webhook delivery failed; retrying", attrs...)
		}
	}
	s.sent.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", result)))
	if err := s.store.Finish(context.WithoutCancel(ctx), c.ID, c.Attempts, o); err != nil {
		s.log.Warn("webhook delivery: recording the attempt failed (the delivery is retried when its lease passes)", "id", c.ID, "err", err)
	}
}

// backoff is the wait after the n'th failed attempt: BackoffBase doubled
// per earlier failure, at most BackoffMax, with "equal jitter" (between
// half and all of it) so receivers that fail together are not retried in
// lockstep.
func (s *Sender) backoff(n int) time.Duration {
	d := s.cfg.BackoffBase
	for i := 1; i < n && d < s.cfg.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, s.cfg.BackoffMax)
	return d/2 + rand.N(d/2+1)
}

// Event is the body of every delivery.
type Event struct {
	// ID is the event id: the receiver's idempotency key.
	ID string `json:"id"`
	// Type is link.created, link.updated or link.deleted.
	Type string `json:"type"`
	// Time is when the event happened, RFC 3339.
	Time time.Time `json:"time"`
	// Tenant is the subscription's (and the link's) tenant.
	Tenant string `json:"tenant"`
	// Data is the link as the event left it.
	Data json.RawMessage `json:"data"`
}

// body returns the JSON body of c: the event, its data with short_url.
// The queued data carries the link key (links.code, the click events'
// code): on a custom domain it is split, as the API shows a link, into the
// bare code and "domain", and the short URL is on that domain.
func (s *Sender) body(c claim) ([]byte, error) {
	var data map[string]any
	if err := json.Unmarshal(c.Data, &data); err != nil {
		return nil, err
	}
	if key, ok := data["code"].(string); ok {
		domain, code := linkdomain.Split(key)
		data["code"], data["short_url"] = code, strings.TrimSuffix(s.baseURL, "/")+"/"+code
		if domain != "" {
			data["domain"], data["short_url"] = domain, "https://"+domain+"/"+code
		}
	}
	d, err := json.Marshal(data)
	if err != nil {
		return nil, err
	}
	return json.Marshal(Event{ID: c.ID, Type: c.EventType, Time: c.Created.UTC(), Tenant: c.Tenant, Data: d})
}

// attempt POSTs c once.
func (s *Sender) attempt(ctx context.Context, c claim) outcome {
	secret, err := s.sealer.Open(c.SubscriptionID, c.Sealed)
	if err != nil {
		return outcome{err: err.Error(), dead: true}
	}
	body, err := s.body(c)
	if err != nil {
		return outcome{err: "the event cannot be encoded: " + err.Error(), dead: true}
	}
	if len(body) > maxBody {
		return outcome{err: fmt.Sprintf("the event is %d bytes, over the %d bytes a delivery may carry", len(body), maxBody), dead: true}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(body))
	if err != nil {
		return outcome{err: "bad url: " + err.Error(), dead: true}
	}
	if req.URL.Scheme != "https" && !s.allowHTTP {
		// Subscribed while http:// was allowed: a signed body goes over
		// TLS or not at all.
		return outcome{err: "refused: the receiver's URL is not https, which this service requires", dead: true}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", userAgent)
	req.Header.Set("Kurz-Event-Id", c.ID)
	// Each subscription gets its own copy of a change, under its own event
	// id: the subscription tells the copies (and the secret) apart.
	req.Header.Set("Kurz-Webhook-Id", c.SubscriptionID)
	req.Header.Set("Kurz-Event-Type", c.EventType)
	req.Header.Set(webhooksig.Header, webhooksig.Sign(secret, s.now(), body))
	resp, err := s.client.Do(req)
	if err != nil {
		cause := err
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			cause = ue.Err // the URL may carry the tenant's credentials in its query; the ids name it
		}
		return outcome{err: s.failure(err, req.URL.Hostname()), cause: cause}
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 {
		// 101 Switching Protocols hands back the raw connection as the
		// body, which neither the client's timeout nor ctx bounds: a
		// receiver could hold the attempt (and its sender slot) for as
		// long as it kept the socket open. No body of it is read.
		return outcome{status: resp.StatusCode, err: fmt.Sprintf("HTTP %d: the receiver must answer 2xx", resp.StatusCode)}
	}
	// Whatever the body is, the attempt's deadline ends its reading.
	defer context.AfterFunc(ctx, func() { resp.Body.Close() })()
	head, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return outcome{status: resp.StatusCode}
	}
	msg := fmt.Sprintf("HTTP %d", resp.StatusCode)
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		msg += " (redirects are not followed)"
	}
	if t := scrub(string(head)); t != "" {
		msg += ": " + t
	}
	return outcome{status: resp.StatusCode, err: msg}
}

// failure is the sentence the tenant sees for an attempt that got no
// answer, host being the receiver's host as subscribed. It is chosen by
// the kind of err, never built from its text: net errors name our side
// (the resolver's address, the local address and port), so the raw error
// goes only to the server's log (deliver).
func (s *Sender) failure(err error, host string) string {
	host = scrub(host)
	var (
		dnsErr  *net.DNSError
		opErr   *net.OpError
		nameErr x509.HostnameError
		authErr x509.UnknownAuthorityError
		certErr x509.CertificateInvalidError
		verErr  *tls.CertificateVerificationError
		recErr  tls.RecordHeaderError
		alert   tls.AlertError
	)
	isOp := errors.As(err, &opErr)
	switch {
	case dialRefused(err):
		return "refused: the receiver resolves to a non-public address"
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return "DNS lookup failed for " + host + ": no such host"
	case errors.As(err, &dnsErr) && dnsErr.IsTimeout:
		return "DNS lookup timed out for " + host
	case errors.As(err, &dnsErr):
		return "DNS lookup failed for " + host
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "no route to the receiver"
	case errors.Is(err, syscall.ETIMEDOUT), isOp && opErr.Op == "dial" && timedOut(err):
		return "connection timed out"
	case timedOut(err):
		return fmt.Sprintf("no answer within %s", s.cfg.Timeout)
	case errors.Is(err, http.ErrSchemeMismatch):
		return "TLS handshake failed: the receiver answered in plain HTTP"
	case errors.As(err, &nameErr):
		return "TLS handshake failed: the certificate is not valid for " + host
	case errors.As(err, &authErr):
		return "TLS handshake failed: the certificate is signed by an unknown authority"
	case errors.As(err, &certErr) && certErr.Reason == x509.Expired:
		return "TLS handshake failed: the certificate has expired or is not yet valid"
	case errors.As(err, &certErr), errors.As(err, &verErr):
		return "TLS handshake failed: the certificate is not valid"
	// crypto/tls reports alerts sent and received as net.OpErrors of these
	// two ops (and as tls.AlertError over QUIC).
	case errors.As(err, &recErr), errors.As(err, &alert),
		isOp && (opErr.Op == "remote error" || opErr.Op == "local error"):
		return "TLS handshake failed"
	case errors.Is(err, syscall.ECONNRESET):
		return "the receiver reset the connection"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.EPIPE):
		return "the receiver closed the connection without an answer"
	}
	return "request failed"
}

// scrub keeps the printable start of s, at most maxErrorText runes.
func scrub(s string) string {
	var b strings.Builder
	n := 0
	for _, r := range s {
		if n == maxErrorText {
			b.WriteString("…")
			break
		}
		if !unicode.IsPrint(r) {
			r = ' '
		}
		b.WriteRune(r)
		n++
	}
	return strings.TrimSpace(b.String())
}
