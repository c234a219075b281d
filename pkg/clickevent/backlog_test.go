package clickevent

import "testing"

// A group counter left too high by a trim (redis/redis#13958) is learnt
// when the group is caught up and taken off the lag afterwards, until the
// stream or the group is made anew.
func TestLagsTakeTheCounterErrorOff(t *testing.T) {
	l := NewLags(nil, "g")
	steps := []struct {
		name string
		in   Backlog
		want int64
	}{
		{"behind, error not known yet: at most the stream's length", Backlog{Unread: 5, RedisLag: 20, entriesRead: 1, entriesAdded: 21}, 5},
		{"caught up: Redis's lag is all error", Backlog{CaughtUp: true, RedisLag: 15, entriesRead: 6, entriesAdded: 21}, 0},
		{"3 new entries", Backlog{Unread: 5, RedisLag: 18, entriesRead: 6, entriesAdded: 24}, 3},
		{"Redis cannot tell: the length stands", Backlog{Unread: 5, RedisLag: -1, entriesRead: 6, entriesAdded: 24}, 5},
		{"1 of them read", Backlog{Unread: 5, RedisLag: 17, entriesRead: 7, entriesAdded: 24}, 2},
		{"stream made anew: the error no longer applies", Backlog{Unread: 4, RedisLag: 4, entriesRead: 0, entriesAdded: 4}, 4},
		{"and is not learnt back", Backlog{Unread: 5, RedisLag: 5, entriesRead: 0, entriesAdded: 5}, 5},
	}
	for _, s := range steps {
		if got := l.correct("k", s.in).Unread; got != s.want {
			t.Errorf("%s: Unread %d, want %d", s.name, got, s.want)
		}
	}
}
