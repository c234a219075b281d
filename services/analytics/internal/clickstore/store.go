// Package clickstore keeps clicks in ClickHouse: the raw rows the consumer
// inserts, the hourly aggregates materialized views derive from them, and the
// queries GetLinkStats reads.
//
// Counting is exact although delivery is at-least-once. Every statistic is a
// sum over pre-aggregated rows (a link with millions of clicks reads a few
// hundred rows, not millions), so a row inserted twice would count twice.
// Three things prevent that:
//
//   - before inserting an entry that may be stored already (redelivered, or
//     retried after an insert whose outcome is unknown) the consumer asks
//     Existing and skips what is there;
//   - a row is inserted as suspect (suspect=1, copied into click_suspects)
//     unless the consumer received its entry first-hand (XREADGROUP ">") and
//     sends it for the first time;
//   - queries subtract the excess of every suspect event that has more than
//     one row (Duplicates), so a duplicate that slipped past the lookup (two
//     consumers racing on a reclaimed entry) counts once.
//
// Redis delivers an entry first-hand exactly once, so of two rows of one
// event at least one is suspect, and every duplicate is found. The raw table
// is a plain MergeTree so that copies are never merged away from under the
// aggregates. Suspect rows are usually rare (after a crash, a takeover or an
// insert that failed mid-way) and clustered in time, so the correction reads
// little; but while fewer Redis replicas are online than the consumer's
// WAIT asks for, every click is suspect, and the correction reads every raw
// row of the range (see Duplicates).
//
// Residuals: an event the producer appended twice (two entries) is caught
// only when both land in one batch; two events of one link whose 64-bit
// EIDs collide, one of them suspect, would count once.
package clickstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"math"
	"net"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"kurz.dev/pkg/chconn"
)

// Click is one row of the raw table.
type Click struct {
	Tenant       string
	Code         string
	Time         time.Time
	EventID      string
	Visitor      string
	Referrer     string
	ReferrerHost string
	UserAgent    string
	Browser      string
	OS           string
	Device       string
	// Country is the client's ISO 3166-1 alpha-2 code, "" when unknown.
	Country string
	Bot     bool
	Flood   bool
	// NewVisitor marks the visitor's first human click of the UTC day on
	// this link: the sum of NewVisitor is the number of unique visitors.
	NewVisitor bool
	// Suspect marks a row that may duplicate another (see the package doc).
	Suspect bool
	// Rule and Variant name the link's redirect rule or variant that chose
	// the destination; empty when none did.
	Rule, Variant string
}

// EID is the 64-bit FNV-1a hash of an event ID: the raw table's sort key
// tail, and a compact key for the duplicate checks.
func EID(eventID string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(eventID)) // never fails
	return h.Sum64()
}

// Store reads and writes clicks. It is safe for concurrent use.
type Store struct {
	conn   driver.Conn
	layout Layout
	// linkCountsMemory is LinkCountsMemory; tests lower it.
	linkCountsMemory int
}

// MaxReplicaDelay is how far behind its shard's replication log (the age
// of the oldest insert it has not fetched) a cluster replica may be and
// still answer a read (whole seconds: the setting's unit). ClickHouse's defaults let a replica 300 s behind answer
// with what it has (a replica back from a stop answered a link's 100 clicks
// of 150, no error), and the duplicate lookup would then miss stored rows.
// A read that no fresh enough replica of a shard can serve fails instead:
// Unavailable, as with the shard down. The window that remains: a replica
// less than this behind answers without its newest rows.
const MaxReplicaDelay = 5 * time.Second

// read is ctx with the settings of a read on s's layout: on a cluster, a
// replica lagging more than MaxReplicaDelay is not read (the initiator
// tries the shard's other replica and fails the read if none is fresh).
// ClickHouse checks the lag of the table a shard's query reads from, not of
// the tables its subqueries read (see Duplicates). Inserts keep the
// defaults: a stale replica stores a new block as well as a fresh one.
func (s *Store) read(ctx context.Context) context.Context { return s.readWith(ctx, nil) }

// readWith is read with settings of the query's own besides (a query's
// settings replace the context's whole, so they are set together).
func (s *Store) readWith(ctx context.Context, settings clickhouse.Settings) context.Context {
	if s.layout.Cluster != "" {
		if settings == nil {
			settings = clickhouse.Settings{}
		}
		settings["max_replica_delay_for_distributed_queries"] = int(MaxReplicaDelay / time.Second)
		settings["fallback_to_stale_replicas_for_distributed_queries"] = 0
	}
	if len(settings) == 0 {
		return ctx
	}
	return clickhouse.Context(ctx, clickhouse.WithSettings(settings))
}

// New returns a store over conn, its tables laid out as l; the schema must
// have been applied (Apply).
func New(conn driver.Conn, l Layout) *Store {
	return &Store{conn: conn, layout: l, linkCountsMemory: LinkCountsMemory}
}

// ErrNotSent wraps an insert failure that happened before any row reached
// ClickHouse: retrying cannot duplicate anything.
var ErrNotSent = errors.New("insert not sent")

// Insert writes rows in one batch. An error wrapping ErrNotSent means nothing
// was stored; any other error leaves the outcome unknown (ClickHouse may
// have committed the rows before the connection failed).
func (s *Store) Insert(ctx context.Context, rows []Click) error {
	if len(rows) == 0 {
		return nil
	}
	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO "+EventsTable+" ("+strings.Join(eventColumns, ", ")+")")
	if err != nil {
		return fmt.Errorf("clickhouse prepare insert: %w: %w", ErrNotSent, err)
	}
	now := time.Now()
	for i := range rows {
		r := &rows[i]
		if err := b.Append(r.Tenant, r.Code, r.Time, r.EventID, EID(r.EventID), r.Visitor, r.Referrer,
			r.ReferrerHost, r.UserAgent, r.Browser, r.OS, r.Device,
			u8(r.Bot), u8(r.Flood), u8(r.NewVisitor), u8(r.Suspect), now, r.Country, r.Rule, r.Variant); err != nil {
			_ = b.Abort()
			return fmt.Errorf("clickhouse append: %w: %w", ErrNotSent, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("clickhouse insert %d rows: %w", len(rows), err)
	}
	return nil
}

// Answered tells an insert that ClickHouse received and answered with an
// error (an exception: too many parts, a memory limit, a view that
// failed) from one whose rows may never have arrived. Such an insert may
// still have kept rows: ClickHouse writes a block to the raw table before
// it pushes it to the materialized views, and does not take it back when
// a view fails, so the rows are in click_events and missing from the
// aggregates. (Not on a cluster's unreachable peer, which is unreachable.)
func Answered(err error) bool {
	var exception *clickhouse.Exception
	return errors.As(err, &exception) && !unreachable(err) && !errors.Is(err, ErrNotSent)
}

// existingChunk bounds the keys of one Existing query, existingQueryBytes
// its text: ClickHouse refuses a query over max_query_size (256 KiB by
// default), and a key can be ~700 bytes (a 63-character tenant, a custom
// domain's 253 characters, its alias, quoted), so a thousand of them may
// not fit.
const (
	existingChunk      = 1000
	existingQueryBytes = 128 << 10
)

// existingQueries are the queries of Existing for rows: each asks for at
// most existingChunk keys in at most existingQueryBytes (plus one key).
func existingQueries(rows []Click) []string {
	var out []string
	var q strings.Builder
	n := 0
	flush := func() {
		q.WriteString(")")
		out = append(out, q.String())
		q.Reset()
		n = 0
	}
	for _, r := range rows {
		if n == 0 {
			q.WriteString("SELECT event_id FROM " + EventsTable + " WHERE (tenant, code, ts, eid) IN (")
		} else {
			q.WriteString(", ")
		}
		fmt.Fprintf(&q, "(%s, %s, toDateTime(%d), %d)", quote(r.Tenant), quote(r.Code), r.Time.Unix(), EID(r.EventID))
		if n++; n == existingChunk || q.Len() >= existingQueryBytes {
			flush()
		}
	}
	if n > 0 {
		flush()
	}
	return out
}

// Existing returns the event IDs among rows that the raw table already
// holds. The lookup uses the full sort key, so it reads a few granules.
func (s *Store) Existing(ctx context.Context, rows []Click) (map[string]bool, error) {
	found := make(map[string]bool)
	for _, q := range existingQueries(rows) {
		res, err := s.conn.Query(s.read(ctx), q)
		if err != nil {
			return nil, readErr(ctx, "clickhouse existing events", err)
		}
		for res.Next() {
			var id string
			if err := res.Scan(&id); err != nil {
				res.Close()
				return nil, fmt.Errorf("clickhouse existing events: %w", err)
			}
			found[id] = true
		}
		err = res.Err()
		res.Close()
		if err != nil {
			return nil, fmt.Errorf("clickhouse existing events: %w", err)
		}
	}
	return found, nil
}

// Range selects one link's clicks in [Start, End); both are whole UTC hours,
// the resolution of the aggregates, within [Earliest, Latest].
type Range struct {
	Tenant, Code string
	Start, End   time.Time
}

// Earliest and Latest bound the times a Range may name: ClickHouse's
// DateTime is an unsigned 32-bit count of seconds, and toDateTime takes any
// other number modulo 2^32 (on 18.16 toDateTime(6089934592) is
// 2026-11-18 02:01:36), so a range past them would count another period.
var (
	Earliest = time.Unix(0, 0).UTC()
	Latest   = time.Unix(math.MaxUint32, 0).UTC()
)

// ErrRangeOutOfBounds is a Range reaching past Earliest or Latest; the
// caller should have refused it.
var ErrRangeOutOfBounds = errors.New("clickstore: range outside what DateTime holds")

// check refuses a range the queries would count wrongly.
func (r Range) check() error {
	if r.Start.Before(Earliest) || r.End.After(Latest) {
		return fmt.Errorf("%w: [%s, %s)", ErrRangeOutOfBounds, r.Start.UTC().Format(time.RFC3339), r.End.UTC().Format(time.RFC3339))
	}
	return nil
}

// Counts splits clicks by who made them. Human, Bot and Flood add up to
// Total; a bot's click is a bot click even when it floods.
type Counts struct {
	Total, Human, Bot, Flood int64
	// Visitors is the number of distinct visitor-days among human clicks.
	Visitors int64
}

// Add adds o to c.
func (c *Counts) Add(o Counts) {
	c.Total += o.Total
	c.Human += o.Human
	c.Bot += o.Bot
	c.Flood += o.Flood
	c.Visitors += o.Visitors
}

// Sub subtracts o from c.
func (c *Counts) Sub(o Counts) {
	c.Total -= o.Total
	c.Human -= o.Human
	c.Bot -= o.Bot
	c.Flood -= o.Flood
	c.Visitors -= o.Visitors
}

// ErrUnavailable wraps a read that failed because ClickHouse could not be
// reached or the connection broke mid-query: an outage, worth retrying,
// unlike an error ClickHouse answered (a bad query, a missing table).
var ErrUnavailable = errors.New("clickhouse unavailable")

// ErrBusy wraps a read that waited for one of the store's connections
// while every one was in use, until the driver gave up (within
// KURZ_CLICKHOUSE_DIAL_TIMEOUT): too many reads at once, not an outage.
var ErrBusy = errors.New("every clickhouse connection is busy")

// readErr is the package's readErr, and ErrBusy when the read found no free
// connection of s's pool in time.
func (s *Store) readErr(ctx context.Context, what string, err error) error {
	if ctx.Err() == nil && chconn.Busy(s.conn, err) {
		return fmt.Errorf("%s: %w: %w", what, ErrBusy, err)
	}
	return readErr(ctx, what, err)
}

// readErr wraps a read's error with what was read, with ctx's error when
// ctx ended (whatever the driver made of it: its socket deadline, the
// context's, fails a read with an i/o timeout, which would read as an
// outage), with context.DeadlineExceeded when ClickHouse stopped the read at
// its time limit (timeLimit), and with ErrUnavailable when ClickHouse was
// unreachable.
func readErr(ctx context.Context, what string, err error) error {
	var exception *clickhouse.Exception
	ended := ctx.Err()
	if deadline, ok := ctx.Deadline(); ok && ended == nil && !time.Now().Before(deadline) {
		// The socket's timer can fire before the context's.
		ended = context.DeadlineExceeded
	}
	switch {
	case ended != nil && !errors.Is(err, ended):
		return fmt.Errorf("%s: %w: %w", what, ended, err)
	case errors.As(err, &exception) && exception.Code == timeoutExceeded:
		return fmt.Errorf("%s: %w: %w", what, context.DeadlineExceeded, err)
	case unreachable(err):
		return fmt.Errorf("%s: %w: %w", what, ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// timeoutExceeded is ClickHouse's TIMEOUT_EXCEEDED: a query ran past its
// max_execution_time.
const timeoutExceeded = 159

// timeLimit is the SETTINGS clause that makes ClickHouse stop a read when
// ctx's deadline passes (rounded up to a second, as the setting counts).
// The driver gives up on a read at the deadline, but ClickHouse 18.16 goes
// on computing it: a cut GROUP BY over 1.5 M referrer keys ran 5 s more,
// until the driver's own max_execution_time of the deadline plus 5 s,
// which a SETTINGS clause of the query overrides.
func timeLimit(ctx context.Context) string {
	deadline, ok := ctx.Deadline()
	if !ok {
		return ""
	}
	secs := int64(math.Ceil(time.Until(deadline).Seconds()))
	return fmt.Sprintf("\n\t\tSETTINGS max_execution_time = %d", max(secs, 1))
}

// peerUnreachable are the codes of a ClickHouse exception that says another
// server of the cluster could not be reached, or no replica of a shard was
// fresh enough to read (see Store.read): ALL_CONNECTION_TRIES_FAILED,
// NETWORK_ERROR, SOCKET_TIMEOUT, ALL_REPLICAS_ARE_STALE.
var peerUnreachable = []int32{279, 210, 209, 369}

// unreachable tells a ClickHouse that cannot be reached (no connection, a
// connection lost, no connection free in time) from an error it answered.
// The caller's own cancellation or deadline is neither
// (context.DeadlineExceeded is a net.Error).
func unreachable(err error) bool {
	var exception *clickhouse.Exception
	var netErr net.Error
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	case errors.As(err, &exception):
		// On a cluster the server that took the query answers for the
		// others: it could not reach every replica of a shard.
		return slices.Contains(peerUnreachable, exception.Code)
	}
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, clickhouse.ErrAcquireConnTimeout) || errors.Is(err, clickhouse.ErrConnectionClosed)
}

// Hourly returns r's counts per hour (Unix seconds of the hour's start), as
// the aggregates hold them: duplicates not yet subtracted.
func (s *Store) Hourly(ctx context.Context, r Range) (map[int64]Counts, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	rows, err := s.conn.Query(s.read(ctx), `SELECT toUInt32(hour) AS h,
			sum(total), sum(human), sum(bot), sum(flood), sum(visitors)
		FROM `+HourlyTable+`
		WHERE tenant = ? AND code = ? AND hour >= toDateTime(?) AND hour < toDateTime(?)
		GROUP BY h`+timeLimit(ctx), r.Tenant, r.Code, r.Start.Unix(), r.End.Unix())
	if err != nil {
		return nil, s.readErr(ctx, "clickhouse hourly counts", err)
	}
	defer rows.Close()
	out := make(map[int64]Counts)
	for rows.Next() {
		var h uint32
		var total, human, bot, flood, visitors uint64
		if err := rows.Scan(&h, &total, &human, &bot, &flood, &visitors); err != nil {
			return nil, s.readErr(ctx, "clickhouse hourly counts", err)
		}
		out[int64(h)] = Counts{Total: int64(total), Human: int64(human), Bot: int64(bot), Flood: int64(flood), Visitors: int64(visitors)}
	}
	if err := rows.Err(); err != nil {
		return nil, s.readErr(ctx, "clickhouse hourly counts", err)
	}
	return out, nil
}

// Dims returns r's human clicks per dimension and key, as the aggregates
// hold them (duplicates not yet subtracted): of each dimension of limits
// (DimReferrer, ...) the limits[dim] keys with the most clicks, ties by
// key, leaving out the key "" of DimRule and DimVariant (the clicks none
// chose). ClickHouse picks them, so a link with millions of referrer hosts
// sends limits[dim] of them, not millions: one ORDER BY ... LIMIT per
// dimension, which sorts partially (LIMIT n BY dim sorted a link's 1.5 M
// referrer keys in full, and took twice as long).
func (s *Store) Dims(ctx context.Context, r Range, limits map[string]int) (map[string]map[string]int64, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	if len(limits) == 0 {
		return nil, errors.New("clickstore: no dimension asked for")
	}
	var q strings.Builder
	var args []any
	q.WriteString("SELECT dim, key, n FROM (")
	for i, dim := range slices.Sorted(maps.Keys(limits)) {
		n := limits[dim]
		if n < 1 {
			return nil, fmt.Errorf("clickstore: %d keys of %s asked for, want at least 1", n, dim)
		}
		if i > 0 {
			q.WriteString("\n\tUNION ALL\n\t")
		}
		none := ""
		if dim == DimRule || dim == DimVariant {
			none = " AND key != ''"
		}
		fmt.Fprintf(&q, `SELECT dim, key, sum(clicks) AS n FROM %s
		WHERE tenant = ? AND code = ? AND hour >= toDateTime(?) AND hour < toDateTime(?) AND dim = ?%s
		GROUP BY dim, key ORDER BY n DESC, key LIMIT %d`, DimsTable, none, n)
		args = append(args, r.Tenant, r.Code, r.Start.Unix(), r.End.Unix(), dim)
	}
	// On 18.16 a SETTINGS clause after a UNION ALL belongs to its last
	// SELECT (max_execution_time = 1 stopped nothing): it goes on a query
	// around them.
	q.WriteString(")" + timeLimit(ctx))
	rows, err := s.conn.Query(s.read(ctx), q.String(), args...)
	if err != nil {
		return nil, s.readErr(ctx, "clickhouse dimension counts", err)
	}
	defer rows.Close()
	out := make(map[string]map[string]int64)
	for rows.Next() {
		var dim, key string
		var n uint64
		if err := rows.Scan(&dim, &key, &n); err != nil {
			return nil, s.readErr(ctx, "clickhouse dimension counts", err)
		}
		if out[dim] == nil {
			out[dim] = make(map[string]int64)
		}
		out[dim][key] = int64(n)
	}
	if err := rows.Err(); err != nil {
		return nil, s.readErr(ctx, "clickhouse dimension counts", err)
	}
	return out, nil
}

// Owners returns the tenants that have clicks on code, at most a few.
func (s *Store) Owners(ctx context.Context, code string) ([]string, error) {
	rows, err := s.conn.Query(s.read(ctx),
		"SELECT DISTINCT tenant FROM "+OwnersTable+" WHERE code = ? LIMIT 16"+timeLimit(ctx), code)
	if err != nil {
		return nil, s.readErr(ctx, "clickhouse owners", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, s.readErr(ctx, "clickhouse owners", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, s.readErr(ctx, "clickhouse owners", err)
	}
	return out, nil
}

// Flags are one row's classification.
type Flags struct {
	Bot, Flood, NewVisitor bool
}

// Duplicate is one event stored more than once. Copies share the event's
// fields; only the flags can differ (the flood check ran once per copy).
type Duplicate struct {
	EID uint64
	// Hour is the Unix second of the event's hour.
	Hour                                       int64
	ReferrerHost, Browser, OS, Device, Country string
	Rule, Variant                              string
	Copies                                     []Flags
}

// Duplicates returns r's events stored more than once. Only events with a
// suspect row can be, so the lookup reads the raw rows at the suspects'
// times only (the primary key narrows "ts IN (subquery)" to their granules):
// nothing when the range has no suspects, and otherwise a cost that follows
// the incidents (a crash, a takeover, a failed insert), not the link's size.
//
// It takes two steps, so that the fields ClickHouse groups are the
// duplicates' only: first the duplicated events' keys (per suspect event an
// eid, its time and a count, and the suspects' times and eids to match),
// then the fields and flags of those events, at their own times. One step
// grouping every suspect event with its fields took ~860 bytes per suspect:
// 400,000 suspects (a Redis master without its replica stores every click
// as suspect) took 344 MiB per call, and 1.2 M would pass the 1 GB limit of
// a query. The first step still grows with the suspects, ~150 bytes each
// (400,000 in under 64 MiB, 1.6 s on 18.16).
func (s *Store) Duplicates(ctx context.Context, r Range) ([]Duplicate, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	// On a cluster the suspects are read through the Distributed table,
	// once, and their keys sent to the shards (GLOBAL IN): a subquery of a
	// shard's own click_suspects_local would read it on whichever replica
	// serves click_events_local, and ClickHouse checks that replica's lag
	// for click_events_local only. Each table replicates on its own queue,
	// so a replica holding a redelivery's raw rows and rollups but not yet
	// its suspects counted every copy (100 for 50 clicks, for good while
	// its fetches were stopped). Read on its own, click_suspects is subject
	// to MaxReplicaDelay like every table. The keys are few: suspects are
	// rare.
	in, suspects := "IN", `SELECT %s FROM `+SuspectsTable+`
		WHERE tenant = ? AND code = ? AND ts >= toDateTime(?) AND ts < toDateTime(?)`
	if s.layout.Cluster != "" {
		in = "GLOBAL IN"
	}
	rows, err := s.conn.Query(s.read(ctx), `SELECT eid, toUInt32(any(ts))
		FROM `+EventsTable+`
		WHERE tenant = ? AND code = ? AND ts >= toDateTime(?) AND ts < toDateTime(?)
			AND ts `+in+` (`+fmt.Sprintf(suspects, "ts")+`)
			AND eid `+in+` (`+fmt.Sprintf(suspects, "eid")+`)
		GROUP BY eid
		HAVING count() > 1`+timeLimit(ctx),
		r.Tenant, r.Code, r.Start.Unix(), r.End.Unix(),
		r.Tenant, r.Code, r.Start.Unix(), r.End.Unix(),
		r.Tenant, r.Code, r.Start.Unix(), r.End.Unix())
	if err != nil {
		return nil, s.readErr(ctx, "clickhouse duplicates", err)
	}
	var keys []eventKey
	for rows.Next() {
		var k eventKey
		if err := rows.Scan(&k.eid, &k.ts); err != nil {
			rows.Close()
			return nil, s.readErr(ctx, "clickhouse duplicates", err)
		}
		keys = append(keys, k)
	}
	err = rows.Err()
	rows.Close()
	if err != nil {
		return nil, s.readErr(ctx, "clickhouse duplicates", err)
	}
	var out []Duplicate
	for chunk := range slices.Chunk(keys, duplicatesChunk) {
		if out, err = s.duplicateDetails(ctx, r, chunk, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// eventKey is a duplicated event's eid and time (copies share the event's
// time, as the consumer's lookup relies on too).
type eventKey struct {
	eid uint64
	ts  uint32
}

// duplicatesChunk bounds the events of one duplicateDetails query: its
// text, ~50 bytes an event, stays far below max_query_size (256 KiB).
const duplicatesChunk = 1000

// duplicateDetails appends to out the copies of keys' events: the primary
// key narrows "ts IN (...)" to the granules of those events' times.
func (s *Store) duplicateDetails(ctx context.Context, r Range, keys []eventKey, out []Duplicate) ([]Duplicate, error) {
	var times, eids strings.Builder
	for i, k := range keys {
		if i > 0 {
			times.WriteString(", ")
			eids.WriteString(", ")
		}
		fmt.Fprintf(&times, "toDateTime(%d)", k.ts)
		fmt.Fprintf(&eids, "%d", k.eid)
	}
	rows, err := s.conn.Query(s.read(ctx), `SELECT eid, toUInt32(any(ts)), any(referrer_host), any(browser), any(os), any(device), any(country),
			any(rule), any(variant), groupArray(is_bot), groupArray(is_flood), groupArray(new_visitor)
		FROM `+EventsTable+`
		WHERE tenant = ? AND code = ? AND ts >= toDateTime(?) AND ts < toDateTime(?)
			AND ts IN (`+times.String()+`)
			AND eid IN (`+eids.String()+`)
		GROUP BY eid
		HAVING count() > 1`+timeLimit(ctx),
		r.Tenant, r.Code, r.Start.Unix(), r.End.Unix())
	if err != nil {
		return nil, s.readErr(ctx, "clickhouse duplicates", err)
	}
	defer rows.Close()
	for rows.Next() {
		var d Duplicate
		var ts uint32
		var bots, floods, news []uint8
		if err := rows.Scan(&d.EID, &ts, &d.ReferrerHost, &d.Browser, &d.OS, &d.Device, &d.Country, &d.Rule, &d.Variant, &bots, &floods, &news); err != nil {
			return nil, s.readErr(ctx, "clickhouse duplicates", err)
		}
		d.Hour = int64(ts) / 3600 * 3600
		for i := range bots {
			d.Copies = append(d.Copies, Flags{Bot: bots[i] == 1, Flood: floods[i] == 1, NewVisitor: news[i] == 1})
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, s.readErr(ctx, "clickhouse duplicates", err)
	}
	return out, nil
}

// Excess is what d's copies beyond one added to the aggregates: the counts
// of every copy minus those of one canonical copy. The canonical copy is the
// most severe: a bot if any copy is a bot, else a flood if any copy is, else
// human (a new visitor if any human copy is). Total excess is always
// len(Copies)-1; only the split among human, bot and flood depends on the
// rule. The breakdowns (DimsTable) count human rows only, so their excess
// in each dimension is Human.
func (d Duplicate) Excess() Counts {
	var counted, canon Counts
	var anyBot, anyFlood, anyNew bool
	for _, f := range d.Copies {
		counted.Add(flagCounts(f))
		anyBot = anyBot || f.Bot
		anyFlood = anyFlood || f.Flood
		anyNew = anyNew || (f.NewVisitor && !f.Bot && !f.Flood)
	}
	canon = flagCounts(Flags{Bot: anyBot, Flood: anyFlood, NewVisitor: anyNew && !anyBot && !anyFlood})
	counted.Sub(canon)
	return counted
}

// flagCounts is what one row adds to the aggregates (see the hourly view).
func flagCounts(f Flags) Counts {
	c := Counts{Total: 1}
	switch {
	case f.Bot:
		c.Bot = 1
	case f.Flood:
		c.Flood = 1
	default:
		c.Human = 1
	}
	if f.NewVisitor {
		c.Visitors = 1
	}
	return c
}

func u8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

var quoter = strings.NewReplacer(`\`, `\\`, `'`, `\'`)

// quote writes s as a ClickHouse string literal.
func quote(s string) string { return "'" + quoter.Replace(s) + "'" }

// linkCountsQueryBytes bounds the text of a LinkCounts query as
// ClickHouse's max_query_size, which the read sets to it: the codes are
// listed four times, and a thousand keys of custom domains take up to
// ~290 KB a list, past the 256 KiB ClickHouse parses by default.
const linkCountsQueryBytes = 2 << 20

// LinkCountsMemory bounds the memory of one LinkCounts read
// (max_memory_usage): a page is one of the replica's MaxRequests reads at
// once, and must not take ClickHouse's gigabyte for one query beside the
// consumer's inserts. A million duplicated events of a page's links fit
// it (~175 MiB measured on 18.16); past it the read fails, and the list
// is answered without its counts.
const LinkCountsMemory = 256 << 20

// LinkCounts returns the counts of each of codes (link keys, at most a
// few thousand, validated by the caller) of tenant in [start, end), whole
// UTC hours, duplicates subtracted as Duplicates' Excess would: one query
// for them all, summing the hourly aggregates per code and, in the same
// read, the excess of every suspect event stored more than once. A code
// without clicks of tenant is absent from the map.
func (s *Store) LinkCounts(ctx context.Context, tenant string, codes []string, start, end time.Time) (map[string]Counts, error) {
	if err := (Range{Start: start, End: end}).check(); err != nil {
		return nil, err
	}
	out := make(map[string]Counts)
	if len(codes) == 0 {
		return out, nil
	}
	// Literals, not bound parameters: the code list is one text used four
	// times, and what it holds (codes and domain names, quoted) has no
	// character the driver's binding or ClickHouse's parser treats apart.
	var list strings.Builder
	for i, c := range codes {
		if i > 0 {
			list.WriteString(", ")
		}
		list.WriteString(quote(c))
	}
	of := func(col string) string {
		return fmt.Sprintf("tenant = %s AND code IN (%s) AND %s >= toDateTime(%d) AND %s < toDateTime(%d)",
			quote(tenant), list.String(), col, start.Unix(), col, end.Unix())
	}
	in := "IN" // see Duplicates for GLOBAL IN on a cluster
	if s.layout.Cluster != "" {
		in = "GLOBAL IN"
	}
	suspects := "SELECT %s FROM " + SuspectsTable + " WHERE " + of("ts")
	// Per duplicated event, the second branch adds the canonical copy's
	// counts less every copy's (see Excess): its most severe copy counts,
	// a bot if any copy is, else a flood if any is, else a human, a new
	// visitor if a human copy is. It groups the events by a hash of the
	// link's key, not the key: keyed by up to 300 bytes of a custom
	// domain's key, 100,000 duplicated events took over 80 MiB and a
	// million passed ClickHouse's gigabyte for a query. The hourly branch
	// names each hash's key (one of tenant's links each: two of a page
	// sharing a 64-bit hash would be counted together); an excess without
	// hourly rows of its link is dropped, as stats drops it.
	q := `SELECT max(code) AS key, sum(t), sum(h), sum(b), sum(f), sum(v) FROM (
		SELECT code, cityHash64(code) AS k, toInt64(sum(total)) AS t, toInt64(sum(human)) AS h,
			toInt64(sum(bot)) AS b, toInt64(sum(flood)) AS f, toInt64(sum(visitors)) AS v
		FROM ` + HourlyTable + ` WHERE ` + of("hour") + `
		GROUP BY code
	UNION ALL
		SELECT '', k, toInt64(1) - n,
			toInt64(bots = 0 AND floods = 0) - (n - bots - floods),
			toInt64(bots > 0) - bots,
			toInt64(bots = 0 AND floods > 0) - floods,
			toInt64(new_humans > 0 AND bots = 0 AND floods = 0) - news
		FROM (
			SELECT cityHash64(code) AS k, toInt64(count()) AS n, toInt64(sum(is_bot)) AS bots,
				toInt64(sum(is_flood = 1 AND is_bot = 0)) AS floods, toInt64(sum(new_visitor)) AS news,
				toInt64(sum(new_visitor = 1 AND is_bot = 0 AND is_flood = 0)) AS new_humans
			FROM ` + EventsTable + `
			WHERE ` + of("ts") + `
				AND ts ` + in + ` (` + fmt.Sprintf(suspects, "ts") + `)
				AND eid ` + in + ` (` + fmt.Sprintf(suspects, "eid") + `)
			GROUP BY k, eid
			HAVING count() > 1
		)
	)
	GROUP BY k
	HAVING key != ''` + timeLimit(ctx)
	rows, err := s.conn.Query(s.readWith(ctx, clickhouse.Settings{
		"max_query_size": linkCountsQueryBytes, "max_memory_usage": s.linkCountsMemory}), q)
	if err != nil {
		return nil, s.readErr(ctx, "clickhouse link counts", err)
	}
	defer rows.Close()
	for rows.Next() {
		var code string
		var c Counts
		if err := rows.Scan(&code, &c.Total, &c.Human, &c.Bot, &c.Flood, &c.Visitors); err != nil {
			return nil, s.readErr(ctx, "clickhouse link counts", err)
		}
		out[code] = c
	}
	if err := rows.Err(); err != nil {
		return nil, s.readErr(ctx, "clickhouse link counts", err)
	}
	return out, nil
}
