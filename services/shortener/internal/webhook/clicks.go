package webhook

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/clickevent"
)

const (
	// clickReadCount bounds the entries one XREADGROUP takes from a shard.
	clickReadCount = 500
	// maxClickBatch bounds the entries held before a flush (memory): a
	// batch this big is flushed before its interval ends.
	maxClickBatch = 100_000
	// clickTenantsTTL is how long the set of tenants subscribed to
	// link.clicked is cached.
	clickTenantsTTL = 5 * time.Second
)

// ClickBatcher turns the click streams into link.clicked deliveries: it
// reads every shard through a consumer group of its own (analytics' group
// is not touched), counts the clicks of links whose tenant subscribed to
// link.clicked, and one ClickInterval after the first entry it read since
// its last flush queues one delivery per link and subscription, then
// acknowledges the entries. Each replica counts its own share of the
// entries and queues its own deliveries for them: with several replicas a
// link can get one link.clicked per replica per interval. The delivery id is
// derived from the subscription, the link and the batch's first entry, and
// inserted with ON CONFLICT DO NOTHING, so a batch queued again after a
// crash between the insert and the XACK is not queued twice. Entries of a
// replica that died before its flush are claimed (XAUTOCLAIM) by another
// after three intervals: counts are at least once. While no tenant
// subscribes to link.clicked, the group is moved to the streams' ends
// instead of reading them. A replica that stops leaves the group where it
// holds nothing pending; one killed is removed by another once ForgetIdle
// has passed (consumers are named per process).
type ClickBatcher struct {
	// ForgetIdle is how long another consumer of the group must have been
	// idle, with nothing pending, to be removed (default 1h; set before
	// Run).
	ForgetIdle time.Duration

	cfg      Config
	rdb      redis.Cmdable
	db       *Store
	keys     []string
	consumer string
	log      *slog.Logger

	mu       sync.Mutex
	tenants  map[string]bool
	loadedAt time.Time
}

// NewClickBatcher returns a batcher over the click streams of layout.
func NewClickBatcher(cfg Config, rdb redis.Cmdable, store *Store, layout clickevent.StreamConfig, log *slog.Logger) *ClickBatcher {
	return &ClickBatcher{ForgetIdle: time.Hour, cfg: cfg, rdb: rdb, db: store, keys: clickevent.StreamKeys(layout.Shards),
		consumer: "shortener-" + strings.ToLower(rand.Text()[:10]), log: log}
}

// clickBatch is what a batcher holds between flushes.
type clickBatch struct {
	// started is when the batch took its first entry: it is flushed an
	// interval later. Counted from the batch's creation (the last flush),
	// the first read after a quiet spell flushed at once, and a link's
	// clicks of a few seconds came as two events.
	started time.Time
	links   map[linkKey]*clickCount
	// acks are the entries no tenant is owed (not subscribed, or not a
	// click event), owed the counted ones by tenant: stream key -> entry
	// ids. A tenant's entries are acknowledged once its deliveries are
	// queued, so that one tenant's failure leaves only its own pending.
	acks    map[string][]string
	owed    map[string]map[string][]string
	entries int
}

type linkKey struct{ tenant, code string }

type clickCount struct {
	n           int
	first, last time.Time
	firstEntry  string // stream key and entry id of the first click, for the delivery id
}

func newClickBatch() *clickBatch {
	return &clickBatch{links: map[linkKey]*clickCount{}, acks: map[string][]string{}, owed: map[string]map[string][]string{}}
}

// due reports whether batch is to be flushed at now: it holds entries, and
// took the first one interval ago, or holds as many as it may.
func (batch *clickBatch) due(now time.Time, interval time.Duration) bool {
	return batch.entries > 0 && (now.Sub(batch.started) >= interval || batch.entries >= maxClickBatch)
}

// Run batches until ctx ends; what it holds then is left pending, to be
// claimed again.
func (b *ClickBatcher) Run(ctx context.Context) {
	defer b.leave(context.WithoutCancel(ctx))
	grouped := false
	failing := false // the last read failed: logged once, until one succeeds
	batch := newClickBatch()
	var claimed time.Time // the last look for a dead replica's entries
	for ctx.Err() == nil {
		if !grouped {
			grouped = b.ensureGroups(ctx) == nil
		}
		tenants, err := b.clickTenants(ctx)
		if err != nil && ctx.Err() == nil {
			b.log.Warn("webhook clicks: reading the subscriptions failed", "err", err)
		}
		if err != nil && tenants == nil {
			// Never read: whose clicks are owed is unknown, so nothing is
			// read (a read acknowledges every entry) and the group stays
			// where it is (skipToEnd would drop every click not read yet,
			// other replicas' subscribers' too).
			select {
			case <-ctx.Done():
			case <-time.After(b.cfg.PollInterval):
			}
			continue
		}
		read := 0
		if len(tenants) == 0 && batch.entries == 0 && grouped {
			b.skipToEnd(ctx)
		} else if grouped {
			var err error
			read, err = b.read(ctx, tenants, batch)
			switch {
			case err != nil && !failing && ctx.Err() == nil:
				b.log.Warn("webhook clicks: reading the click streams failed; retrying every poll interval", "err", err)
				failing = true
			case err == nil && failing:
				b.log.Info("webhook clicks: reading the click streams again")
				failing = false
			}
		}
		// Every interval, whether clicks come or not: a replica that died
		// (or stopped) before its flush leaves its entries pending, and
		// on a quiet system no new click would ever bring them along.
		if grouped && time.Since(claimed) >= b.cfg.ClickInterval {
			b.claim(ctx, tenants, batch)
			b.forget(ctx)
			claimed = time.Now()
		}
		if batch.due(time.Now(), b.cfg.ClickInterval) {
			if err := b.flush(ctx, batch); err != nil {
				if ctx.Err() == nil {
					b.log.Warn("webhook clicks: queueing a batch failed; its clicks stay pending and are claimed again", "err", err)
				}
			}
			batch = newClickBatch()
		}
		if read == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(b.cfg.PollInterval):
			}
		}
	}
}

func (b *ClickBatcher) ensureGroups(ctx context.Context) error {
	for _, key := range b.keys {
		err := b.rdb.XGroupCreateMkStream(ctx, key, b.cfg.ClickGroup, "$").Err()
		if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
			if ctx.Err() == nil {
				b.log.Warn("webhook clicks: creating the consumer group failed", "stream", key, "err", err)
			}
			return err
		}
	}
	return nil
}

// skipToEnd moves the group to the streams' ends: with no subscriber,
// nothing is owed, and a first subscriber must not get the backlog.
func (b *ClickBatcher) skipToEnd(ctx context.Context) {
	for _, key := range b.keys {
		_ = b.rdb.XGroupSetID(ctx, key, b.cfg.ClickGroup, "$").Err()
	}
}

// clickTenants returns the tenants with a link.clicked subscription
// (cached for clickTenantsTTL).
func (b *ClickBatcher) clickTenants(ctx context.Context) (map[string]bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tenants != nil && time.Since(b.loadedAt) < clickTenantsTTL {
		return b.tenants, nil
	}
	ts, err := b.db.ClickTenants(ctx)
	if err != nil {
		return b.tenants, err
	}
	b.tenants, b.loadedAt = ts, time.Now()
	return ts, nil
}

// read takes new entries from every shard into batch and returns how
// many, and the first failure (the other shards are read all the same).
func (b *ClickBatcher) read(ctx context.Context, tenants map[string]bool, batch *clickBatch) (int, error) {
	n := 0
	var first error
	for _, key := range b.keys {
		res, err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: b.cfg.ClickGroup, Consumer: b.consumer,
			Streams: []string{key, ">"}, Count: clickReadCount, Block: -1}).Result()
		if err != nil {
			if !errors.Is(err, redis.Nil) && first == nil {
				first = fmt.Errorf("%s: %w", key, err)
			}
			continue
		}
		for _, s := range res {
			n += len(s.Messages)
			batch.add(key, s.Messages, tenants, time.Now())
		}
	}
	return n, first
}

// claim takes over entries other consumers have held for three intervals
// (a replica that died before its flush).
func (b *ClickBatcher) claim(ctx context.Context, tenants map[string]bool, batch *clickBatch) {
	for _, key := range b.keys {
		msgs, _, err := b.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: key, Group: b.cfg.ClickGroup, Consumer: b.consumer,
			MinIdle: 3 * b.cfg.ClickInterval, Start: "0-0", Count: clickReadCount}).Result()
		if err == nil {
			batch.add(key, msgs, tenants, time.Now())
		}
	}
}

// forget removes the group's consumers idle for ForgetIdle with nothing
// pending (replicas killed without leaving) on every shard.
func (b *ClickBatcher) forget(ctx context.Context) {
	gone, err := clickevent.ForgetIdleConsumers(ctx, b.rdb, b.keys, b.cfg.ClickGroup, b.consumer, b.ForgetIdle)
	if err != nil && ctx.Err() == nil {
		b.log.Warn("webhook clicks: forgetting idle consumers failed", "err", err)
	}
	if len(gone) > 0 {
		b.log.Info("webhook clicks: forgot idle consumers with nothing pending", "consumers", gone)
	}
}

// leave removes this replica from every shard's group where it holds no
// pending entry (what it held unflushed stays, to be claimed).
func (b *ClickBatcher) leave(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := clickevent.LeaveGroup(ctx, b.rdb, b.keys, b.cfg.ClickGroup, b.consumer); err != nil {
		b.log.Warn("webhook clicks: leaving the click group failed", "err", err)
	}
}

// add counts the clicks of subscribed tenants' links, read at now; every
// entry is acknowledged at the flush, counted or not (a poison entry
// included).
func (batch *clickBatch) add(key string, msgs []redis.XMessage, tenants map[string]bool, now time.Time) {
	if batch.entries == 0 && len(msgs) > 0 {
		batch.started = now
	}
	for _, m := range msgs {
		batch.entries++
		ev, err := clickevent.Parse(m.Values)
		if err != nil || !tenants[ev.Tenant] {
			batch.acks[key] = append(batch.acks[key], m.ID)
			continue
		}
		owed := batch.owed[ev.Tenant]
		if owed == nil {
			owed = map[string][]string{}
			batch.owed[ev.Tenant] = owed
		}
		owed[key] = append(owed[key], m.ID)
		k := linkKey{ev.Tenant, ev.Code}
		c := batch.links[k]
		if c == nil {
			c = &clickCount{first: ev.Time, last: ev.Time, firstEntry: key + "/" + m.ID}
			batch.links[k] = c
		}
		c.n++
		if ev.Time.Before(c.first) {
			c.first = ev.Time
		}
		if ev.Time.After(c.last) {
			c.last = ev.Time
		}
	}
}

// clickData is a link.clicked event's data.
type clickData struct {
	Code           string    `json:"code"`
	Clicks         int       `json:"clicks"`
	FirstClickTime time.Time `json:"first_click_time"`
	LastClickTime  time.Time `json:"last_click_time"`
}

// flush queues the batch's deliveries tenant by tenant, the tenants with
// the fewest links first, then acknowledges the entries of the tenants
// whose deliveries it queued and those no tenant is owed. Queued in one
// transaction, one tenant's volume (10,000 links clicked, 10 link.clicked
// subscriptions: 7.8 s of the 8 s the transaction had) failed the flush
// for every tenant, interval after interval; now a tenant whose queueing
// fails keeps its entries pending (claimed again, see claim) and the
// others' go on.
func (b *ClickBatcher) flush(ctx context.Context, batch *clickBatch) error {
	byTenant := map[string][]clickRow{}
	for k, c := range batch.links {
		data, err := json.Marshal(clickData{Code: k.code, Clicks: c.n, FirstClickTime: c.first.UTC(), LastClickTime: c.last.UTC()})
		if err != nil {
			return err
		}
		byTenant[k.tenant] = append(byTenant[k.tenant], clickRow{batchKey: k.code + "|" + c.firstEntry, data: data})
	}
	order := slices.SortedFunc(maps.Keys(byTenant), func(x, y string) int {
		return cmp.Or(cmp.Compare(len(byTenant[x]), len(byTenant[y])), strings.Compare(x, y))
	})
	var errs []error
	for _, tenant := range order {
		full, err := b.db.QueueClicks(ctx, tenant, byTenant[tenant], b.cfg.MaxPending)
		if full > 0 {
			b.log.Warn("webhook clicks: link.clicked not queued for subscriptions with a full backlog",
				"tenant", tenant, "subscriptions", full, "links", len(byTenant[tenant]), "max_pending", b.cfg.MaxPending)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("tenant %s (%d links): %w", tenant, len(byTenant[tenant]), err))
			continue
		}
		for key, ids := range batch.owed[tenant] {
			batch.acks[key] = append(batch.acks[key], ids...)
		}
	}
	for key, ids := range batch.acks {
		for len(ids) > 0 {
			n := min(len(ids), 1000)
			if err := b.rdb.XAck(ctx, key, b.cfg.ClickGroup, ids[:n]...).Err(); err != nil {
				return fmt.Errorf("xack %s: %w", key, err)
			}
			ids = ids[n:]
		}
	}
	return errors.Join(errs...)
}

// clickRow is one link's clicks of a batch, to queue for each of its
// tenant's link.clicked subscriptions.
type clickRow struct {
	batchKey string
	data     []byte
}

// ClickTenants returns the tenants with a link.clicked subscription.
func (s *Store) ClickTenants(ctx context.Context) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.db.Query(ctx, `SELECT DISTINCT tenant FROM webhook_subscriptions
		WHERE 'link.clicked' = ANY (events) AND deleted_at IS NULL`)
	if err != nil {
		return nil, fmt.Errorf("click subscribers: %w", err)
	}
	ts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("click subscribers: %w", err)
	}
	out := make(map[string]bool, len(ts))
	for _, t := range ts {
		out[t] = true
	}
	return out, nil
}

// clickChunk bounds the links of one QueueClicks statement: with 10
// subscriptions, 2,500 deliveries, far within the query timeout.
const clickChunk = 250

// QueueClicks queues a link.clicked delivery per row and subscription of
// tenant, clickChunk rows a statement (each its own transaction, within
// the query timeout however many links were clicked); a delivery already
// queued (the same id) is kept, so a batch queued again after a failure
// part way only adds what is missing. A subscription with maxPending
// pending deliveries gets none (at most a chunk past it): it returns the
// most such subscriptions a statement found. The subscriptions are read FOR KEY
// SHARE (the lock the deliveries' foreign key takes anyway): one whose
// delete is committing is waited for and skipped, where the foreign key
// check failed the whole flush
// (pkg/linkschema/0012_webhooks_lock_subscriptions.sql).
func (s *Store) QueueClicks(ctx context.Context, tenant string, rows []clickRow, maxPending int) (full int, err error) {
	for len(rows) > 0 {
		n := min(len(rows), clickChunk)
		f, err := s.queueClicks(ctx, tenant, rows[:n], maxPending)
		full = max(full, f)
		if err != nil {
			return full, err
		}
		rows = rows[n:]
	}
	return full, nil
}

func (s *Store) queueClicks(ctx context.Context, tenant string, rows []clickRow, maxPending int) (full int, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	keys, data := make([]string, len(rows)), make([]string, len(rows))
	for i, r := range rows {
		keys[i], data[i] = r.batchKey, string(r.data)
	}
	// The backlog is counted up to maxPending entries of the due index
	// (subscription_id, next_attempt_at) WHERE status = 'pending'; a
	// subscription marked backlogged (MarkBacklogged) is full without a
	// count: its tenant's every flush statement would otherwise count its
	// maxPending entries again, to queue nothing.
	err = s.db.QueryRow(ctx, `
		WITH subs AS (
			SELECT s.id, CASE WHEN s.backlogged THEN $4 ELSE (SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries d
				WHERE d.subscription_id = s.id AND d.status = 'pending' LIMIT $4) p) END AS pending
			FROM webhook_subscriptions s
			WHERE s.tenant = $1 AND 'link.clicked' = ANY (s.events) AND s.deleted_at IS NULL
			FOR KEY SHARE OF s),
		queued AS (
			INSERT INTO webhook_deliveries (id, subscription_id, tenant, event_type, data)
			SELECT 'evt_' || md5(s.id || '|' || r.key), s.id, $1, 'link.clicked', r.data::jsonb
			FROM subs s, unnest($2::text[], $3::text[]) AS r(key, data)
			WHERE s.pending < $4
			ON CONFLICT (id) DO NOTHING)
		SELECT count(*) FROM subs WHERE pending >= $4`, tenant, keys, data, maxPending).Scan(&full)
	if err != nil {
		return 0, fmt.Errorf("queue link.clicked: %w", err)
	}
	return full, nil
}
