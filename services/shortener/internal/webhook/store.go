package webhook

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Delivery statuses, as stored.
const (
	statusPending   = "pending"
	statusSucceeded = "succeeded"
	statusDead      = "dead"
)

// Errors of the store.
var (
	errNotFound      = errors.New("not found")
	errTooMany       = errors.New("too many subscriptions")
	errNotRedelivery = errors.New("delivery is still pending")
)

// Subscription is a row of webhook_subscriptions, without its secret.
type Subscription struct {
	ID, Tenant, URL, Description string
	Events                       []string
	Created                      time.Time
	// RequestKey and RequestHash are set on one created with an
	// idempotency key: the SHA-256 of the key and of the create's request
	// (linkapi.IdempotencyKey, RequestHash). Create writes them and reads
	// them back for a repeat; nil elsewhere.
	RequestKey, RequestHash []byte
}

// Delivery is a row of webhook_deliveries.
type Delivery struct {
	ID, SubscriptionID, Tenant, EventType string
	Data                                  []byte
	Status                                string
	Attempts                              int
	LastError                             string
	LastStatus                            int
	Created, Queued, NextAttempt          time.Time
	LastAttempt                           *time.Time
}

// claim is a delivery the sender took, with what it needs to send it.
type claim struct {
	Delivery
	URL    string
	Sealed []byte
}

// Store keeps subscriptions and the delivery queue in PostgreSQL.
type Store struct {
	db      *pgxpool.Pool
	timeout time.Duration
}

// NewStore returns a Store on db; every statement is bounded by timeout.
func NewStore(db *pgxpool.Pool, timeout time.Duration) *Store {
	return &Store{db: db, timeout: timeout}
}

// Create inserts sub with its sealed secret, unless its tenant already has
// max subscriptions (checked under a per-tenant lock, so concurrent creates
// cannot pass it together). With sub.RequestKey, the tenant's live
// subscription made with that key, if any, is returned instead, with its
// RequestHash and created false (not its secret: a repeat does not show
// it), under the same lock: of concurrent creates with one key, one
// inserts and the others find it.
func (s *Store) Create(ctx context.Context, sub Subscription, sealed []byte, max int) (got Subscription, created bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	got = sub
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('webhooks:' || $1, 0))`, sub.Tenant); err != nil {
			return err
		}
		if sub.RequestKey != nil {
			err := tx.QueryRow(ctx, `
				SELECT id, url, description, events, created_at, request_hash FROM webhook_subscriptions
				WHERE tenant = $1 AND request_key = $2 AND deleted_at IS NULL`, sub.Tenant, sub.RequestKey).
				Scan(&got.ID, &got.URL, &got.Description, &got.Events, &got.Created, &got.RequestHash)
			if err == nil || !errors.Is(err, pgx.ErrNoRows) {
				return err // found (created stays false), or failed
			}
			got = sub
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM webhook_subscriptions WHERE tenant = $1 AND deleted_at IS NULL`,
			sub.Tenant).Scan(&n); err != nil {
			return err
		}
		if n >= max {
			return errTooMany
		}
		created = true
		return tx.QueryRow(ctx, `
			INSERT INTO webhook_subscriptions (id, tenant, url, events, description, secret, request_key, request_hash)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING created_at`,
			sub.ID, sub.Tenant, sub.URL, sub.Events, sub.Description, sealed, sub.RequestKey, sub.RequestHash).Scan(&got.Created)
	})
	if err != nil && !errors.Is(err, errTooMany) {
		err = fmt.Errorf("create webhook: %w", err)
	}
	return got, created && err == nil, err
}

// List returns tenant's subscriptions, oldest first.
func (s *Store) List(ctx context.Context, tenant string) ([]Subscription, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.db.Query(ctx, `
		SELECT id, tenant, url, description, events, created_at FROM webhook_subscriptions
		WHERE tenant = $1 AND deleted_at IS NULL ORDER BY created_at, id`, tenant)
	if err != nil {
		return nil, fmt.Errorf("list webhooks: %w", err)
	}
	subs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Subscription, error) {
		var sub Subscription
		err := r.Scan(&sub.ID, &sub.Tenant, &sub.URL, &sub.Description, &sub.Events, &sub.Created)
		return sub, err
	})
	if err != nil {
		return nil, fmt.Errorf("list webhooks: %w", err)
	}
	return subs, nil
}

// Delete removes tenant's subscription id: it is marked deleted, which
// takes it out of the API, the queueing and the claims at once, and the
// senders purge its deliveries and the row later (PurgeDeleted). A DELETE
// cascading over the delivery log in one statement outlasted the query
// timeout for a busy subscription (1.5M deliveries), which then could not
// be deleted at all.
func (s *Store) Delete(ctx context.Context, tenant, id string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tag, err := s.db.Exec(ctx, `UPDATE webhook_subscriptions SET deleted_at = now()
		WHERE id = $1 AND tenant = $2 AND deleted_at IS NULL`, id, tenant)
	if err != nil {
		return fmt.Errorf("delete webhook: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errNotFound
	}
	return nil
}

const deliveryColumns = `id, subscription_id, tenant, event_type, data, status, attempts, last_error,
	last_status, created_at, queued_at, next_attempt_at, last_attempt_at`

func scanDelivery(r pgx.Row, extra ...any) (Delivery, error) {
	var d Delivery
	err := r.Scan(append([]any{&d.ID, &d.SubscriptionID, &d.Tenant, &d.EventType, &d.Data, &d.Status, &d.Attempts,
		&d.LastError, &d.LastStatus, &d.Created, &d.Queued, &d.NextAttempt, &d.LastAttempt}, extra...)...)
	return d, err
}

// cursor is where a page of deliveries resumes: after (created, id).
type cursor struct {
	Created time.Time
	ID      string
}

// Deliveries returns up to limit of tenant's subscription's deliveries,
// newest first, after cur (nil: from the newest), in status (empty: any).
// A subscription that is not the tenant's is errNotFound.
func (s *Store) Deliveries(ctx context.Context, tenant, subID, status string, limit int, cur *cursor) ([]Delivery, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var exists bool
	if err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM webhook_subscriptions WHERE id = $1 AND tenant = $2 AND deleted_at IS NULL)`,
		subID, tenant).Scan(&exists); err != nil {
		return nil, fmt.Errorf("list deliveries: %w", err)
	}
	if !exists {
		return nil, errNotFound
	}
	var after *time.Time
	var afterID string
	if cur != nil {
		after, afterID = &cur.Created, cur.ID
	}
	// The pending and dead deliveries, few among a busy subscription's
	// succeeded ones, have an index of their own (0014), which the planner
	// takes only when the query itself says the status is not succeeded.
	which := `($3 = '' OR status = $3)`
	if status == statusPending || status == statusDead {
		which = `status = $3 AND status <> 'succeeded'`
	}
	rows, err := s.db.Query(ctx, `SELECT `+deliveryColumns+` FROM webhook_deliveries
		WHERE subscription_id = $1 AND tenant = $2 AND `+which+`
		  AND ($4::timestamptz IS NULL OR (created_at, id) < ($4, $5))
		ORDER BY created_at DESC, id DESC LIMIT $6`, subID, tenant, status, after, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list deliveries: %w", err)
	}
	ds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) { return scanDelivery(r) })
	if err != nil {
		return nil, fmt.Errorf("list deliveries: %w", err)
	}
	return ds, nil
}

// Redeliver queues tenant's finished (dead or succeeded) delivery id of
// subID again, due now, with a fresh count of attempts and retry window.
func (s *Store) Redeliver(ctx context.Context, tenant, subID, id string) (Delivery, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	d, err := scanDelivery(s.db.QueryRow(ctx, `
		UPDATE webhook_deliveries SET status = 'pending', attempts = 0, queued_at = now(), next_attempt_at = now()
		WHERE id = $1 AND subscription_id = $2 AND tenant = $3 AND status <> 'pending'
		  AND subscription_id IN (SELECT id FROM webhook_subscriptions WHERE deleted_at IS NULL)
		RETURNING `+deliveryColumns, id, subID, tenant))
	if errors.Is(err, pgx.ErrNoRows) {
		var exists bool
		if err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM webhook_deliveries
			WHERE id = $1 AND subscription_id = $2 AND tenant = $3
			  AND subscription_id IN (SELECT id FROM webhook_subscriptions WHERE deleted_at IS NULL))`,
			id, subID, tenant).Scan(&exists); err != nil {
			return Delivery{}, fmt.Errorf("redeliver: %w", err)
		}
		if exists {
			return Delivery{}, errNotRedelivery
		}
		return Delivery{}, errNotFound
	}
	if err != nil {
		return Delivery{}, fmt.Errorf("redeliver: %w", err)
	}
	return d, nil
}

// claimLimits are the most deliveries of one subscription and of one
// tenant a sender sends at once.
type claimLimits struct{ perSub, perTenant int }

// inFlight counts the deliveries a sender is sending, per subscription and
// per tenant.
type inFlight struct {
	subs, tenants map[string]int
}

func newInFlight() inFlight {
	return inFlight{subs: map[string]int{}, tenants: map[string]int{}}
}

// add counts d more (or, negative, fewer) deliveries of c in flight.
func (f inFlight) add(c claim, d int) {
	count(f.subs, c.SubscriptionID, d)
	count(f.tenants, c.Tenant, d)
}

func count(m map[string]int, k string, d int) {
	if m[k] += d; m[k] <= 0 {
		delete(m, k)
	}
}

func (f inFlight) clone() inFlight {
	return inFlight{subs: maps.Clone(f.subs), tenants: maps.Clone(f.tenants)}
}

// total is the number of deliveries in flight.
func (f inFlight) total() int {
	n := 0
	for _, k := range f.tenants {
		n += k
	}
	return n
}

// unnestArgs returns m as two arrays for unnest: keys and their counts.
func unnestArgs(m map[string]int) ([]string, []int32) {
	keys, counts := make([]string, 0, len(m)), make([]int32, 0, len(m))
	for k, n := range m {
		keys, counts = append(keys, k), append(counts, int32(n))
	}
	return keys, counts
}

// Claim takes up to n due deliveries for one attempt each, those of the
// tenants with the fewest in flight first, then the oldest due, but no
// more of one subscription or one tenant than the caller may still send
// (limits less what it already sends): it counts the attempt
// and pushes next_attempt_at lease ahead, so no other sender takes them
// meanwhile, and a sender that dies leaves them due again once the lease
// passes. Rows other senders hold are skipped, not waited for. A
// suspended tenant's deliveries (tenant_suspensions, which the gateway's
// admin API writes) are held: not claimed, their attempts and retry
// window untouched, so that they go out as they were once it resumes
// (within one poll). One that waited past the retry window still gets its
// attempt; only a failure then finds the window spent.
func (s *Store) Claim(ctx context.Context, n int, lease time.Duration, limits claimLimits, sending inFlight) ([]claim, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	subs, subsN := unnestArgs(sending.subs)
	tenants, tenantsN := unnestArgs(sending.tenants)
	// pending_subs walks the due index (subscription_id, next_attempt_at)
	// from one subscription with a due delivery to the next (a loose index
	// scan; pending rows not yet due are skipped inside the index, once
	// each): the claim costs one pass over the pending index entries and a
	// step per subscription with something due, not a probe per
	// subscription (at 100,000 subscriptions: 188-200 against 6-7 ms with
	// 55 of them pending, 374-395 against 12-13 ms with 20,000 pending and
	// 5 due). pick fills the free slots round the tenants: a tenant's
	// k'th candidate counts as its in-flight deliveries plus k, and the
	// lowest go first (oldest due among equals). Oldest due first alone
	// gave every freed slot to the tenants with the oldest backlogs (two
	// with receivers that never answer held all 8 slots of a replica, and
	// a third tenant's delivery waited 97 s).
	rows, err := s.db.Query(ctx, `
		WITH RECURSIVE pending_subs(id) AS (
			(SELECT subscription_id FROM webhook_deliveries
			WHERE status = 'pending' AND next_attempt_at <= now()
			ORDER BY subscription_id LIMIT 1)
			UNION ALL
			SELECT (SELECT d.subscription_id FROM webhook_deliveries d
				WHERE d.status = 'pending' AND d.subscription_id > p.id AND d.next_attempt_at <= now()
				ORDER BY d.subscription_id LIMIT 1)
			FROM pending_subs p WHERE p.id IS NOT NULL),
		sent_sub AS (SELECT * FROM unnest($4::text[], $5::int[]) AS t(id, n)),
		sent_tenant AS (SELECT * FROM unnest($6::text[], $7::int[]) AS t(tenant, n)),
		cand AS (
			SELECT x.id, x.next_attempt_at,
				row_number() OVER (PARTITION BY s.tenant ORDER BY x.next_attempt_at) AS rank,
				coalesce(st.n, 0) AS sent, $8 - coalesce(st.n, 0) AS room
			FROM pending_subs p
			JOIN webhook_subscriptions s ON s.id = p.id AND s.deleted_at IS NULL
			LEFT JOIN sent_sub ss ON ss.id = s.id
			LEFT JOIN sent_tenant st ON st.tenant = s.tenant
			CROSS JOIN LATERAL (
				SELECT id, next_attempt_at FROM webhook_deliveries d
				WHERE d.subscription_id = s.id AND d.status = 'pending' AND d.next_attempt_at <= now()
				ORDER BY d.next_attempt_at LIMIT greatest(0, $3 - coalesce(ss.n, 0))) x
			WHERE coalesce(st.n, 0) < $8
				AND NOT EXISTS (SELECT 1 FROM tenant_suspensions ts WHERE ts.tenant = s.tenant)),
		pick AS (SELECT id FROM cand WHERE rank <= room ORDER BY sent + rank, next_attempt_at LIMIT $1),
		due AS (
			SELECT id FROM webhook_deliveries
			WHERE id IN (SELECT id FROM pick) AND status = 'pending' AND next_attempt_at <= now()
			FOR UPDATE SKIP LOCKED)
		UPDATE webhook_deliveries d
		SET attempts = d.attempts + 1, next_attempt_at = now() + make_interval(secs => $2)
		FROM due, webhook_subscriptions s
		WHERE d.id = due.id AND s.id = d.subscription_id AND s.deleted_at IS NULL
		RETURNING d.id, d.subscription_id, d.tenant, d.event_type, d.data, d.status, d.attempts, d.last_error,
			d.last_status, d.created_at, d.queued_at, d.next_attempt_at, d.last_attempt_at, s.url, s.secret`,
		n, lease.Seconds(), limits.perSub, subs, subsN, tenants, tenantsN, limits.perTenant)
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	cs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claim, error) {
		var c claim
		var err error
		c.Delivery, err = scanDelivery(r, &c.URL, &c.Sealed)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim deliveries: %w", err)
	}
	return cs, nil
}

// outcome is how an attempt ended.
type outcome struct {
	status int    // HTTP status; 0: no answer
	err    string // empty: delivered; shown to the tenant
	cause  error  // the raw transport error behind err, for the log only
	dead   bool   // no further attempt
	wait   time.Duration
}

// Finish records the attempt'th attempt of id, unless a later claim took
// the delivery meanwhile (its lease passed).
func (s *Store) Finish(ctx context.Context, id string, attempt int, o outcome) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	status := statusPending
	switch {
	case o.err == "":
		status = statusSucceeded
	case o.dead:
		status = statusDead
	}
	_, err := s.db.Exec(ctx, `
		UPDATE webhook_deliveries SET status = $3, last_status = $4, last_error = $5,
			last_attempt_at = now(), next_attempt_at = now() + make_interval(secs => $6)
		WHERE id = $1 AND attempts = $2 AND status = 'pending'`,
		id, attempt, status, o.status, o.err, o.wait.Seconds())
	if err != nil {
		return fmt.Errorf("record delivery %s: %w", id, err)
	}
	return nil
}

// pruneBatch bounds the rows one delete of Prune removes, so that each
// statement stays within the query timeout however large the backlog.
const pruneBatch = 5000

// Prune deletes finished deliveries whose last attempt is older than
// before, pruneBatch at a time, and returns how many it deleted.
func (s *Store) Prune(ctx context.Context, before time.Time) (int64, error) {
	var total int64
	for {
		n, err := s.pruneOnce(ctx, before)
		total += n
		if err != nil || n < pruneBatch {
			return total, err
		}
	}
}

func (s *Store) pruneOnce(ctx context.Context, before time.Time) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tag, err := s.db.Exec(ctx, `DELETE FROM webhook_deliveries WHERE id IN (
		SELECT id FROM webhook_deliveries WHERE status <> 'pending' AND last_attempt_at < $1 LIMIT $2)`, before, pruneBatch)
	if err != nil {
		return 0, fmt.Errorf("prune deliveries: %w", err)
	}
	return tag.RowsAffected(), nil
}

// trimEntries bounds the finished deliveries one look of TrimFinished
// reads (keep+1 of each subscription at most), so that each look stays
// within the query timeout however many subscriptions are past the bound.
const trimEntries = 100_000

// TrimFinished deletes the finished (succeeded and dead) deliveries of
// each live subscription beyond its newest keep, by event time (the
// deliveries list's order), oldest first, pruneBatch a statement, and
// returns how many it deleted. Pending deliveries are never deleted. The
// retention bounds the finished deliveries by age only, and link.clicked
// makes one per clicked link, interval and subscription: strangers'
// clicks grew the links' database without bound within it.
//
// It looks at the subscriptions in id order, as many a look as keep+1
// entries of each fit in trimEntries (at most purgeSubscriptions): a look
// walks each subscription's newest deliveries (webhook_deliveries_page)
// to its keep+1'th finished one, or to its end, so it reads no more than
// the deliveries kept and the pending among them. Senders
// of several replicas may trim together: a delete skips the rows another
// holds (SKIP LOCKED), and a delivery redelivered meanwhile is pending
// again, which the delete checks on the row it locked.
//
// A look that fails (one subscription whose deliveries take past the query
// timeout to walk: millions pending, before link events were bounded) is
// made again one subscription at a time, skipping those that fail, and the
// errors are returned after the pass: otherwise every subscription after
// it in id order, other tenants' included, would never be trimmed again.
func (s *Store) TrimFinished(ctx context.Context, keep int) (int64, error) {
	page := max(1, min(purgeSubscriptions, trimEntries/(keep+1)))
	return trimPages(page,
		func(after string, n int) ([]trimEdge, string, error) { return s.pastKept(ctx, after, keep, n) },
		func(after string, n int) ([]string, error) { return s.subscriptionIDs(ctx, after, n) },
		func(e trimEdge) (int64, error) { return s.trimOnce(ctx, e) })
}

// trimPages is TrimFinished's pass over the subscriptions, page by page:
// walk finds a page's edges after an id, ids lists a page's subscription
// ids, trim deletes up to pruneBatch deliveries from an edge back.
func trimPages(page int, walk func(after string, n int) ([]trimEdge, string, error),
	ids func(after string, n int) ([]string, error), trim func(trimEdge) (int64, error)) (int64, error) {
	var total int64
	var errs []error
	after := ""
	for {
		edges, last, err := walk(after, page)
		if err != nil {
			errs = append(errs, err)
			var subs []string
			if subs, err = ids(after, page); err != nil {
				return total, errors.Join(append(errs, err)...)
			}
			edges, last = nil, ""
			prev := after
			for _, id := range subs {
				// pastKept's page of one after prev is id's.
				e, _, err := walk(prev, 1)
				if err != nil {
					errs = append(errs, fmt.Errorf("subscription %s: %w", id, err))
				}
				edges, prev = append(edges, e...), id
			}
			if len(subs) == page {
				last = prev
			}
		}
		for _, e := range edges {
			for {
				n, err := trim(e)
				total += n
				if err != nil {
					return total, errors.Join(append(errs, err)...)
				}
				if n < pruneBatch {
					break
				}
			}
		}
		if last == "" {
			return total, errors.Join(errs...)
		}
		after = last
	}
}

// subscriptionIDs lists the ids of the n live subscriptions after the id
// after, in id order: the page pastKept looks at.
func (s *Store) subscriptionIDs(ctx context.Context, after string, n int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.db.Query(ctx, `SELECT id FROM webhook_subscriptions WHERE id > $1 AND deleted_at IS NULL ORDER BY id LIMIT $2`, after, n)
	if err != nil {
		return nil, fmt.Errorf("subscriptions to trim: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("subscriptions to trim: %w", err)
	}
	return ids, nil
}

// trimEdge is the newest finished delivery of a subscription that is past
// the ones it keeps: it and every older finished one go.
type trimEdge struct {
	subID   string
	created time.Time
	id      string
}

// pastKept returns the edges of the next page live subscriptions after
// after (in id order) that have more than keep finished deliveries, and
// the last of the page's ids ("" when the page was the last).
func (s *Store) pastKept(ctx context.Context, after string, keep, page int) (edges []trimEdge, last string, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	err = s.inIndexOrder(ctx, func(tx pgx.Tx) error {
		edges, last = nil, ""
		rows, err := tx.Query(ctx, `
		SELECT s.id, e.created_at, e.id
		FROM (SELECT id FROM webhook_subscriptions WHERE id > $1 AND deleted_at IS NULL ORDER BY id LIMIT $2) s
		LEFT JOIN LATERAL (
			SELECT d.created_at, d.id FROM webhook_deliveries d
			WHERE d.subscription_id = s.id AND d.status <> 'pending'
			ORDER BY d.created_at DESC, d.id DESC OFFSET $3 LIMIT 1) e ON true
		ORDER BY s.id`, after, page, keep)
		if err != nil {
			return err
		}
		defer rows.Close()
		seen := 0
		for rows.Next() {
			var subID string
			var created *time.Time
			var id *string
			if err := rows.Scan(&subID, &created, &id); err != nil {
				return err
			}
			seen, last = seen+1, subID
			if id != nil {
				edges = append(edges, trimEdge{subID: subID, created: *created, id: *id})
			}
		}
		if seen < page {
			last = ""
		}
		return rows.Err()
	})
	if err != nil {
		return nil, "", fmt.Errorf("finished deliveries past the kept: %w", err)
	}
	return edges, last, nil
}

// inIndexOrder runs fn in a transaction whose plans read a subscription's
// deliveries in the order of webhook_deliveries_page rather than all of
// them sorted. The planner's estimate of one subscription's deliveries is
// the table's average (58 in a test with 2,000 subscriptions, for ones
// with 35,000), for which reading them all and sorting looks cheaper: for
// a busy subscription that sorts its whole log in one statement. Every
// statement fn runs has an index that gives its order.
func (s *Store) inIndexOrder(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL enable_sort = off`); err != nil {
			return err
		}
		return fn(tx)
	})
}

// trimOnce deletes up to pruneBatch of e's subscription's finished
// deliveries from e back, oldest first.
func (s *Store) trimOnce(ctx context.Context, e trimEdge) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	// = ANY (ARRAY(...)) deletes by the primary key: IN (...) was planned
	// as a hash join over the whole table. The rows are locked before the
	// delete, so the outer status check sees what the inner one did.
	var n int64
	err := s.inIndexOrder(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM webhook_deliveries WHERE id = ANY (ARRAY(
			SELECT id FROM webhook_deliveries
			WHERE subscription_id = $1 AND status <> 'pending' AND (created_at, id) <= ($2, $3)
			ORDER BY created_at, id LIMIT $4 FOR UPDATE SKIP LOCKED)) AND status <> 'pending'`,
			e.subID, e.created, e.id, pruneBatch)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("trim the finished deliveries of webhook %s: %w", e.subID, err)
	}
	return n, nil
}

// purgeSubscriptions bounds the deleted subscriptions one look of
// PurgeDeleted reads.
const purgeSubscriptions = 100

// PurgeDeleted deletes the deliveries of subscriptions marked deleted,
// pruneBatch at a time (each statement within the query timeout however
// long the log), then each subscription's row once it has none left, and
// returns how many subscriptions it removed. It goes on, purgeSubscriptions
// at a time, until none is left (or a look removes none): 100 a minute
// fell behind one API key creating and deleting 3,000. Senders of several
// replicas may purge together: a row goes only once no delivery refers to
// it, so the foreign key's cascade, whoever ends up deleting it, has next
// to nothing to delete.
func (s *Store) PurgeDeleted(ctx context.Context) (int, error) {
	removed := 0
	for {
		ids, err := s.deletedSubscriptions(ctx)
		if err != nil {
			return removed, err
		}
		n, err := s.purge(ctx, ids)
		removed += n
		if err != nil || len(ids) < purgeSubscriptions || n == 0 {
			return removed, err
		}
	}
}

// purge removes the deleted subscriptions ids, their deliveries first, and
// returns how many it removed.
func (s *Store) purge(ctx context.Context, ids []string) (int, error) {
	removed := 0
	for _, id := range ids {
		for {
			n, err := s.purgeOnce(ctx, id)
			if err != nil {
				return removed, err
			}
			if n < pruneBatch {
				break
			}
		}
		ok, err := s.removeDeleted(ctx, id)
		if err != nil {
			return removed, err
		}
		if ok {
			removed++
		}
	}
	return removed, nil
}

func (s *Store) deletedSubscriptions(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.db.Query(ctx, `SELECT id FROM webhook_subscriptions WHERE deleted_at IS NOT NULL
		ORDER BY deleted_at LIMIT $1`, purgeSubscriptions)
	if err != nil {
		return nil, fmt.Errorf("deleted webhooks: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("deleted webhooks: %w", err)
	}
	return ids, nil
}

func (s *Store) purgeOnce(ctx context.Context, subID string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tag, err := s.db.Exec(ctx, `DELETE FROM webhook_deliveries WHERE id IN (
		SELECT id FROM webhook_deliveries WHERE subscription_id = $1 LIMIT $2)`, subID, pruneBatch)
	if err != nil {
		return 0, fmt.Errorf("purge the deliveries of deleted webhook %s: %w", subID, err)
	}
	return tag.RowsAffected(), nil
}

// removeDeleted deletes the row of the deleted subscription subID if no
// delivery refers to it any more (one purging together with another may
// have stopped early).
func (s *Store) removeDeleted(ctx context.Context, subID string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tag, err := s.db.Exec(ctx, `DELETE FROM webhook_subscriptions s
		WHERE s.id = $1 AND s.deleted_at IS NOT NULL
		  AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.subscription_id = s.id)`, subID)
	if err != nil {
		return false, fmt.Errorf("remove deleted webhook %s: %w", subID, err)
	}
	return tag.RowsAffected() > 0, nil
}

// capped returns the subscriptions and the tenants of sending that are at
// their limits: a sender sending them may claim none of their deliveries.
func capped(sending inFlight, limits claimLimits) (subs, tenants []string) {
	subs, tenants = []string{}, []string{}
	for id, n := range sending.subs {
		if n >= limits.perSub {
			subs = append(subs, id)
		}
	}
	for t, n := range sending.tenants {
		if n >= limits.perTenant {
			tenants = append(tenants, t)
		}
	}
	return subs, tenants
}

// QueueStats returns the pending deliveries, how long the oldest has been
// queued, and how far the most overdue one that a sender sending what
// sending counts could claim now is past its due time: the deliveries of a
// subscription or a tenant at its limit there are left out of the lag (one
// tenant's backlog behind its own slow receivers is no stalled sender).
// The deliveries a suspension holds count as pending, but neither in the
// oldest's age nor in the lag: they wait for an operator, not a sender.
func (s *Store) QueueStats(ctx context.Context, sending inFlight, limits claimLimits) (pending int64, oldest, lag time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	subs, tenants := capped(sending, limits)
	var o, l float64
	err = s.db.QueryRow(ctx, `
		SELECT count(*),
			COALESCE(EXTRACT(EPOCH FROM now() - min(queued_at) FILTER (WHERE NOT held)), 0)::float8,
			COALESCE(EXTRACT(EPOCH FROM now() - min(next_attempt_at) FILTER (WHERE NOT held AND next_attempt_at <= now()
				AND subscription_id <> ALL ($1::text[]) AND tenant <> ALL ($2::text[]))), 0)::float8
		FROM (SELECT d.*, ts.tenant IS NOT NULL AS held FROM webhook_deliveries d
			LEFT JOIN tenant_suspensions ts ON ts.tenant = d.tenant
			WHERE d.status = 'pending'
			  AND d.subscription_id NOT IN (SELECT id FROM webhook_subscriptions WHERE deleted_at IS NOT NULL)) q`,
		subs, tenants).Scan(&pending, &o, &l)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("webhook queue: %w", err)
	}
	return pending, time.Duration(o * float64(time.Second)), time.Duration(l * float64(time.Second)), nil
}

// resealPage is how many subscriptions a rotation's pass reads at a time.
const resealPage = 500

// Reseal seals again under sealer's key every live subscription's secret
// that only its previous key opens, resealPage at a time in id order, and
// returns how many it sealed again and how many neither key opens (left as
// they are: their deliveries fail as before). A row changed meanwhile (by
// another replica's pass) is left to it. Only while sealer is Rotating.
func (s *Store) Reseal(ctx context.Context, sealer *Sealer) (resealed, unopened int, err error) {
	after := ""
	for {
		page, err := s.sealedAfter(ctx, after)
		if err != nil {
			return resealed, unopened, err
		}
		for _, sub := range page {
			secret, old, err := sealer.open(sub.id, sub.sealed)
			switch {
			case err != nil:
				unopened++
				continue
			case !old:
				continue
			}
			ok, err := s.replaceSealed(ctx, sub.id, sub.sealed, sealer.Seal(sub.id, secret))
			if err != nil {
				return resealed, unopened, err
			}
			if ok {
				resealed++
			}
		}
		if len(page) < resealPage {
			return resealed, unopened, nil
		}
		after = page[len(page)-1].id
	}
}

type sealedSecret struct {
	id     string
	sealed []byte
}

func (s *Store) sealedAfter(ctx context.Context, after string) ([]sealedSecret, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.db.Query(ctx, `SELECT id, secret FROM webhook_subscriptions
		WHERE id > $1 AND deleted_at IS NULL ORDER BY id LIMIT $2`, after, resealPage)
	if err != nil {
		return nil, fmt.Errorf("webhook secrets: %w", err)
	}
	page, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sealedSecret, error) {
		var v sealedSecret
		return v, r.Scan(&v.id, &v.sealed)
	})
	if err != nil {
		return nil, fmt.Errorf("webhook secrets: %w", err)
	}
	return page, nil
}

func (s *Store) replaceSealed(ctx context.Context, id string, old, sealed []byte) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tag, err := s.db.Exec(ctx, `UPDATE webhook_subscriptions SET secret = $3 WHERE id = $1 AND secret = $2`, id, old, sealed)
	if err != nil {
		return false, fmt.Errorf("seal webhook %s's secret again: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}
