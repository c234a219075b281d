package clickevent

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Backlog is a consumer group's backlog on one click stream.
type Backlog struct {
	// Pending entries were delivered and not acknowledged yet.
	Pending int64
	// Unread entries were never delivered: 0 when the group was delivered
	// the stream's last entry; else Redis's lag (less its counter's known
	// error when read through Lags), at most the entries the stream holds;
	// the stream's length when Redis cannot tell (before 7.0, or after an
	// XDEL or XGROUP SETID).
	Unread int64
	// CaughtUp: the group was delivered the stream's last entry.
	CaughtUp bool
	// RedisLag is the lag XINFO GROUPS reported, -1 when it could not tell.
	RedisLag int64

	// The group's read counter and the stream's count of entries ever
	// added: both only grow unless the stream or the group is made anew.
	entriesRead, entriesAdded int64
}

// ReadBacklog reads group's backlog on the stream key: XINFO GROUPS, then
// XINFO STREAM, in one round trip. ok is false when the stream or the group
// does not exist.
//
// Redis before 7.4 (redis/redis#13958) keeps the group's read counter, and
// so the lag it reports, too high for good once the stream was trimmed past
// entries the group had not read: after a consumer fell behind by more
// than the stream's MAXLEN, a caught-up group still shows the lag it had.
// CaughtUp does not depend on that counter, and Unread is 0 then and never
// more than the stream holds; Lags also takes the counter's error off.
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
			entriesRead: g.EntriesRead, entriesAdded: s.EntriesAdded}
		switch {
		case b.CaughtUp:
			b.Unread = 0
		case g.Lag < 0:
			b.Unread = s.Length
		default:
			b.Unread = min(g.Lag, s.Length)
		}
		return b, true, nil
	}
	return Backlog{}, false, nil
}

// Lags reads backlogs as ReadBacklog and corrects each stream's Unread by
// its group counter's error, learnt whenever the group is caught up (the
// lag Redis reports then is all error). The error stays constant while
// the group keeps up, so the correction is exact until the stream is again
// trimmed past entries the group had not read; until the group next
// catches up after that, Unread is too high, never too low. Not safe for
// concurrent use.
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
	if known && (b.entriesAdded < learnt.entriesAdded || b.entriesRead < learnt.entriesRead) {
		// The stream or the group was made anew: so was the counter.
		delete(l.excess, key)
		known = false
	}
	switch {
	case b.RedisLag < 0:
	case b.CaughtUp:
		l.excess[key] = b
	case known:
		b.Unread = min(b.Unread, max(b.RedisLag-learnt.RedisLag, 0))
	}
	return b
}
