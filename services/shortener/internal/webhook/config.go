// Package webhook serves kurz.shortener.v1.WebhookService and sends the
// deliveries: tenants subscribe URLs to link events; a trigger on the links
// table queues one delivery per event and subscription in PostgreSQL (in
// the transaction of the change, see pkg/linkschema/0007_webhooks.sql); the
// Sender claims due deliveries (FOR UPDATE SKIP LOCKED, so replicas share
// the work), POSTs each signed (pkg/webhooksig) to a target checked at dial
// time, and retries failures with exponential backoff and jitter until the
// attempts or the retry window run out, then marks them dead, where the API
// shows them and can queue them again. docs/webhooks.md is the user's guide.
package webhook

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/config"
)

// Config is the webhooks' part of the shortener's configuration.
type Config struct {
	// Key seals the subscriptions' signing secrets in PostgreSQL
	// (AES-256-GCM under its SHA-256), at least 32 characters, the same on
	// every replica. Empty: a key derived from KURZ_SHORTENER_CODE_KEY. To
	// change it, move the old one to KURZ_SHORTENER_WEBHOOK_PREVIOUS_KEY:
	// a key changed without it makes existing secrets unreadable (their
	// deliveries die with "secret cannot be opened").
	Key string `env:"SHORTENER_WEBHOOK_KEY" default:""`
	// PreviousKey is the key the secrets were sealed under before Key,
	// during a rotation: secrets sealed under it still open, and the
	// sending replicas seal them again under Key (at start, then every 10
	// minutes; each logs "webhook secrets sealed under the new key" with
	// what is left). "derived" names the key derived from
	// KURZ_SHORTENER_CODE_KEY, for a first dedicated Key. Empty outside a
	// rotation: remove it once a pass that started after the last replica
	// with the old Key went says sealed_again=0 (docs/webhooks.md).
	PreviousKey string `env:"SHORTENER_WEBHOOK_PREVIOUS_KEY" default:""`
	// Send makes this replica send the queued deliveries and read the click
	// streams for link.clicked. false: it serves the webhook API and queues
	// link events (the links table's trigger does) but sends nothing, for
	// replicas kept to the API, or test stacks sharing one database that do
	// not test webhooks.
	Send bool `env:"SHORTENER_WEBHOOK_SEND" default:"true"`
	// AllowHTTP accepts http:// receivers (otherwise https only).
	AllowHTTP bool `env:"SHORTENER_WEBHOOK_ALLOW_HTTP" default:"false"`
	// AllowCIDRs are address ranges receivers may resolve to although they
	// are private, loopback or link-local (comma-separated, e.g.
	// 10.1.0.0/16); every other non-public address is refused when dialled.
	AllowCIDRs []string `env:"SHORTENER_WEBHOOK_ALLOW_CIDRS" default:""`
	// MaxSubscriptions bounds the subscriptions of one tenant.
	MaxSubscriptions int `env:"SHORTENER_WEBHOOK_MAX_SUBSCRIPTIONS" default:"10"`
	// MaxPending bounds the undelivered deliveries of one subscription: a
	// subscription with as many pending (a receiver down, or slower than
	// its events) gets no link.clicked until it has fewer, and no
	// link.created, link.updated or link.deleted from when a sender's
	// pass (every 5s) marks it backlogged until one finds it below 90% of
	// the bound. Events not queued meanwhile are lost to it (the sender
	// logs the mark; kurz_shortener_webhook_backlogged_subscriptions
	// counts the marked). Unbounded, a tenant at its API quota with
	// receivers that never answer queued up to 300,000 deliveries a
	// minute into the links' database.
	MaxPending int `env:"SHORTENER_WEBHOOK_MAX_PENDING" default:"10000"`
	// PollInterval is how often the sender looks for due deliveries (a
	// PostgreSQL query), at least 50ms.
	PollInterval time.Duration `env:"SHORTENER_WEBHOOK_POLL_INTERVAL" default:"1s"`
	// Concurrency bounds the deliveries one replica sends at once.
	Concurrency int `env:"SHORTENER_WEBHOOK_CONCURRENCY" default:"8"`
	// ConcurrencyPerSubscription bounds the deliveries of one subscription
	// a replica sends at once, so that one slow receiver or one backlog
	// cannot take every slot from the other tenants (above
	// KURZ_SHORTENER_WEBHOOK_CONCURRENCY it is that).
	ConcurrencyPerSubscription int `env:"SHORTENER_WEBHOOK_CONCURRENCY_PER_SUBSCRIPTION" default:"2"`
	// ConcurrencyPerTenant bounds the deliveries of one tenant's
	// subscriptions together that a replica sends at once, so that a
	// tenant with several slow receivers cannot take every slot either
	// (above KURZ_SHORTENER_WEBHOOK_CONCURRENCY it is that).
	ConcurrencyPerTenant int `env:"SHORTENER_WEBHOOK_CONCURRENCY_PER_TENANT" default:"4"`
	// Timeout bounds one attempt: connecting, sending, and the answer's
	// status line and headers.
	Timeout time.Duration `env:"SHORTENER_WEBHOOK_TIMEOUT" default:"10s"`
	// MaxAttempts bounds the attempts of one delivery before it is dead.
	MaxAttempts int `env:"SHORTENER_WEBHOOK_MAX_ATTEMPTS" default:"10"`
	// RetryWindow bounds how long a delivery is retried, from its event (or
	// its redelivery); past it the delivery is dead.
	RetryWindow time.Duration `env:"SHORTENER_WEBHOOK_RETRY_WINDOW" default:"24h"`
	// BackoffBase is the wait after a first failure, doubled per further
	// failure (with jitter: between half and all of it).
	BackoffBase time.Duration `env:"SHORTENER_WEBHOOK_BACKOFF_BASE" default:"10s"`
	// BackoffMax bounds the wait between attempts.
	BackoffMax time.Duration `env:"SHORTENER_WEBHOOK_BACKOFF_MAX" default:"1h"`
	// ClickInterval is how long clicks are counted, from the first one read
	// after a flush, before one link.clicked delivery per link (and
	// subscription) carries their number. Each replica counts the clicks it
	// reads and sends its own events for them.
	ClickInterval time.Duration `env:"SHORTENER_WEBHOOK_CLICK_INTERVAL" default:"1m"`
	// ClickGroup is the Redis consumer group that reads the click streams
	// for link.clicked (analytics has its own).
	ClickGroup string `env:"SHORTENER_WEBHOOK_CLICK_GROUP" default:"kurz-webhooks"`
	// Streams is the click stream layout (the redirect's and analytics').
	Streams clickevent.StreamConfig
	// Retention is how long succeeded and dead deliveries stay listed
	// before they are deleted.
	Retention time.Duration `env:"SHORTENER_WEBHOOK_RETENTION" default:"168h"`
	// KeepFinished bounds the succeeded and dead deliveries one
	// subscription keeps within the retention: past it the oldest (by
	// event time) are deleted, with the retention's pass (every 10
	// minutes). link.clicked makes a delivery per clicked link, interval
	// and subscription, and clicks are anyone's to make: by age alone a
	// tenant's traffic kept ~100 million rows a week in the links'
	// database. The default matches KURZ_SHORTENER_WEBHOOK_MAX_PENDING and
	// keeps a week of a delivery a minute. 100 to 1000000: each pass walks
	// the newest this many of a subscription in one statement.
	KeepFinished int `env:"SHORTENER_WEBHOOK_KEEP_FINISHED" default:"10000"`
}

// DerivedKey, as PreviousKey, names the key derived from the code key.
const DerivedKey = "derived"

// Validate checks the settings and returns the allow-listed prefixes.
func (c Config) Validate() ([]netip.Prefix, error) {
	var errs []error
	if c.Key != "" && len(c.Key) < 32 {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_WEBHOOK_KEY has %d characters: want at least 32 (e.g. openssl rand -hex 32)", len(c.Key)))
	}
	switch {
	case c.PreviousKey == "":
	case c.PreviousKey == DerivedKey && c.Key == "":
		errs = append(errs, errors.New("KURZ_SHORTENER_WEBHOOK_PREVIOUS_KEY=derived names the key in use: set KURZ_SHORTENER_WEBHOOK_KEY to the new key"))
	case c.PreviousKey == DerivedKey:
	case len(c.PreviousKey) < 32:
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_WEBHOOK_PREVIOUS_KEY has %d characters: want the previous KURZ_SHORTENER_WEBHOOK_KEY (at least 32), or \"derived\"", len(c.PreviousKey)))
	case c.PreviousKey == c.Key:
		errs = append(errs, errors.New("KURZ_SHORTENER_WEBHOOK_PREVIOUS_KEY is KURZ_SHORTENER_WEBHOOK_KEY: a rotation moves the old key there and sets a new one"))
	}
	var allow []netip.Prefix
	for _, s := range c.AllowCIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("KURZ_SHORTENER_WEBHOOK_ALLOW_CIDRS: %q is not a CIDR such as 10.1.0.0/16", s))
			continue
		}
		allow = append(allow, p.Masked())
	}
	if c.MaxSubscriptions < 1 || c.MaxSubscriptions > 1000 {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_WEBHOOK_MAX_SUBSCRIPTIONS=%d: want 1 to 1000", c.MaxSubscriptions))
	}
	if c.MaxPending < 100 || c.MaxPending > 10_000_000 {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_WEBHOOK_MAX_PENDING=%d: want 100 to 10000000", c.MaxPending))
	}
	if c.KeepFinished < 100 || c.KeepFinished > 1_000_000 {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_WEBHOOK_KEEP_FINISHED=%d: want 100 to 1000000", c.KeepFinished))
	}
	if c.Concurrency < 1 || c.Concurrency > 256 {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_WEBHOOK_CONCURRENCY=%d: want 1 to 256", c.Concurrency))
	}
	if c.ConcurrencyPerSubscription < 1 || c.ConcurrencyPerSubscription > 256 {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_WEBHOOK_CONCURRENCY_PER_SUBSCRIPTION=%d: want 1 to 256", c.ConcurrencyPerSubscription))
	}
	if c.ConcurrencyPerTenant < 1 || c.ConcurrencyPerTenant > 256 {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_WEBHOOK_CONCURRENCY_PER_TENANT=%d: want 1 to 256", c.ConcurrencyPerTenant))
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > 100 {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_WEBHOOK_MAX_ATTEMPTS=%d: want 1 to 100", c.MaxAttempts))
	}
	if c.Timeout <= 0 || c.Timeout > time.Minute {
		errs = append(errs, fmt.Errorf("KURZ_SHORTENER_WEBHOOK_TIMEOUT=%s: want more than 0, at most 1m", c.Timeout))
	}
	errs = append(errs, config.Period("KURZ_SHORTENER_WEBHOOK_POLL_INTERVAL", c.PollInterval, 50*time.Millisecond))
	if c.BackoffBase <= 0 || c.BackoffMax < c.BackoffBase || c.RetryWindow <= 0 || c.Retention <= 0 {
		errs = append(errs, errors.New("KURZ_SHORTENER_WEBHOOK_BACKOFF_BASE, _RETRY_WINDOW and _RETENTION must be positive, and _BACKOFF_MAX at least _BACKOFF_BASE"))
	}
	if c.ClickInterval < time.Second || c.ClickInterval > time.Hour || c.ClickGroup == "" || len(c.ClickGroup) > 64 {
		errs = append(errs, errors.New("KURZ_SHORTENER_WEBHOOK_CLICK_INTERVAL must be 1s to 1h, and KURZ_SHORTENER_WEBHOOK_CLICK_GROUP 1 to 64 characters"))
	}
	errs = append(errs, c.Streams.Validate())
	return allow, errors.Join(errs...)
}
