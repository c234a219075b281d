package clickevent

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Backlog is a consumer group's backlog on one click stream.
type Backlog struct {
	// Pending entries were delivered and not acknowledged yet.
	Pending int64
	// Unread entries were never delivered: 0 when the group was delivered
	// the stream's last entry; every entry the stream holds when a trim
	// passed the group's last delivered one (Overrun); else Redis's lag
	// (less its counter's known error when read through Lags), at most
	// the entries the stream holds, or all of them when Redis cannot tell
	// (a nil lag).
	Unread int64
	// CaughtUp: the group was delivered the stream's last entry.
	CaughtUp bool
	// Overrun: the stream's first entry is past the group's last delivered
	// one, so trims removed entries the group never read (clicks lost)
	// unless none lay between.
	Overrun bool
	// RedisLag is the lag XINFO GROUPS reported, -1 when it could not tell.
	RedisLag int64

	// The group's read counter (0 when Redis has none) and the stream's
	// count of entries ever added: both only grow unless the stream or the
	// group is made anew. counted: Redis computed the lag from that counter
	// (lag = added - read), not from an estimate; only such a lag carries
	// the counter's error.
	entriesRead, entriesAdded int64
	counted                   bool
}

// ReadBacklog reads group's backlog on the stream key: XINFO GROUPS, then
// XINFO STREAM, in one round trip. ok is false when the stream or the group
// does not exist.
//
// Redis 7 until redis/redis#13958 (2025) keeps the group's read counter
// behind, and so the lag it reports too high, for good once the stream was
// trimmed past entries the group had not read: after a consumer fell
// behind by more than the stream's MAXLEN, a caught-up group still shows
// the lag it had. CaughtUp and Overrun do not depend on that counter;
// Unread is 0 when caught up and never more than the stream holds, and
// Lags takes the counter's error off a lag computed from it.
func ReadBacklog(ctx context.Context, rdb redis.Cmdable, key, group string) (b Backlog, ok bool, err error) {
	pipe := rdb.Pipeline()
	groups := pipe.XInfoGroups(ctx, key)
	stream := pipe.XInfoStream(ctx, key)
	if _, err := pipe.Exec(ctx); err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return Backlog{}, false, nil
		}
		return Backlog{}, false, fmt.Errorf("click stream %s: %w", key, err)
	}
	s := stream.Val()
	for _, g := range groups.Val() {
		if g.Name != group {
			continue
		}
		// The stream was read after the group: if the group's last entry
		// was the stream's last then, it was at the group's reading too.
		b = Backlog{Pending: g.Pending, RedisLag: g.Lag, CaughtUp: g.LastDeliveredID == s.LastGeneratedID,
			Overrun:     s.Length > 0 && idBefore(g.LastDeliveredID, s.FirstEntry.ID),
			entriesRead: g.EntriesRead, entriesAdded: s.EntriesAdded,
			counted: g.EntriesRead > 0 && g.Lag >= 0 && g.Lag == s.EntriesAdded-g.EntriesRead}
		switch {
		case b.CaughtUp:
			b.Unread = 0
		case b.Overrun:
			b.Unread = s.Length
		case g.Lag < 0:
			b.Unread = s.Length
		default:
			b.Unread = min(g.Lag, s.Length)
		}
		return b, true, nil
	}
	return Backlog{}, false, nil
}

// TotalBacklog is what group has yet to read or acknowledge on the
// streams keys (ReadBacklog's Pending + Unread, summed): 0 only when the
// group was delivered every stream's last entry and acknowledged all.
func TotalBacklog(ctx context.Context, rdb redis.Cmdable, keys []string, group string) (int64, error) {
	var n int64
	for _, k := range keys {
		b, _, err := ReadBacklog(ctx, rdb, k, group)
		if err != nil {
			return 0, err
		}
		n += b.Pending + b.Unread
	}
	return n, nil
}

// Lags reads backlogs as ReadBacklog and corrects each stream's Unread by
// its group counter's error, learnt whenever the group is caught up (the
// lag Redis reports then is all error), on lags Redis computed from that
// counter only: a Redis that estimates the lag (a fixed one, after a
// trim past the group) has no error to take off, and an overrun counts
// every entry the stream holds. The error stays constant while the group
// keeps up, so the correction is exact until the stream is again trimmed
// past entries the group had not read; until the group next catches up
// after that, Unread is too high, never too low. Not safe for concurrent
// use.
type Lags struct {
	rdb    redis.Cmdable
	group  string
	excess map[string]Backlog // by stream key: the backlog the error was learnt from
}

// NewLags reads group's backlogs on rdb.
func NewLags(rdb redis.Cmdable, group string) *Lags {
	return &Lags{rdb: rdb, group: group, excess: map[string]Backlog{}}
}

// Read is group's backlog on key, corrected; ok as ReadBacklog's.
func (l *Lags) Read(ctx context.Context, key string) (Backlog, bool, error) {
	b, ok, err := ReadBacklog(ctx, l.rdb, key, l.group)
	if err != nil || !ok {
		return b, ok, err
	}
	return l.correct(key, b), true, nil
}

func (l *Lags) correct(key string, b Backlog) Backlog {
	learnt, known := l.excess[key]
	if known && (b.entriesAdded < learnt.entriesAdded || b.entriesRead > 0 && b.entriesRead < learnt.entriesRead) {
		// The stream or the group was made anew: so was the counter. (A
		// nil counter reads as 0 and is not a new one.)
		delete(l.excess, key)
		known = false
	}
	switch {
	case !b.counted:
		// An estimate, or no lag at all: no counter error in it.
	case b.CaughtUp:
		l.excess[key] = b
	case known && !b.Overrun:
		b.Unread = min(b.Unread, max(b.RedisLag-learnt.RedisLag, 0))
	}
	return b
}

// idBefore reports whether stream ID a ("ms-seq") is before b; an ID that
// does not parse is before nothing.
func idBefore(a, b string) bool {
	am, as, ok1 := parseID(a)
	bm, bs, ok2 := parseID(b)
	if !ok1 || !ok2 {
		return false
	}
	return am < bm || am == bm && as < bs
}

func parseID(id string) (ms, seq uint64, ok bool) {
	m, q, found := strings.Cut(id, "-")
	if !found {
		return 0, 0, false
	}
	ms, err1 := strconv.ParseUint(m, 10, 64)
	seq, err2 := strconv.ParseUint(q, 10, 64)
	return ms, seq, err1 == nil && err2 == nil
}
