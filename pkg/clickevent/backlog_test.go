package clickevent

import "testing"

// A group counter left behind by a trim (redis/redis#13958) is learnt when
// the group is caught up and taken off lags computed from that counter,
// never off an estimate or an overrun, until the stream or the group is
// made anew.
func TestLagsTakeTheCounterErrorOff(t *testing.T) {
	l := NewLags(nil, "g")
	// lag: Redis's, from its counter (added - read) unless est.
	b := func(unread, lag, read, added int64, caughtUp, overrun, est bool) Backlog {
		return Backlog{Unread: unread, RedisLag: lag, CaughtUp: caughtUp, Overrun: overrun,
			entriesRead: read, entriesAdded: added, counted: !est && lag >= 0 && read > 0 && lag == added-read}
	}
	steps := []struct {
		name string
		in   Backlog
		want int64
	}{
		{"trim passed the group: every entry held", b(5, 20, 1, 21, false, true, false), 5},
		{"caught up: Redis's lag is all error", b(0, 15, 6, 21, true, false, false), 0},
		{"3 new entries", b(5, 18, 6, 24, false, false, false), 3},
		{"Redis cannot tell: the stream's entries stand", b(5, -1, 6, 24, false, false, false), 5},
		{"1 of them read", b(5, 17, 7, 24, false, false, false), 2},
		{"a nil counter (read as 0) is not a new group, and nothing to correct", b(5, 5, 0, 24, false, false, true), 5},
		{"the error survives it", b(5, 19, 8, 27, false, false, false), 4},
		{"another trim passes the group: every entry, not less the old error", b(1000, 1000, 8, 1027, false, true, false), 1000},
		{"an estimated lag is left as it is", b(600, 600, 300, 1027, false, false, true), 600},
		{"stream made anew: the error no longer applies", b(4, 4, 1, 5, false, false, false), 4},
		{"and is not learnt back", b(5, 5, 1, 6, false, false, false), 5},
	}
	for _, s := range steps {
		if got := l.correct("k", s.in).Unread; got != s.want {
			t.Errorf("%s: Unread %d, want %d", s.name, got, s.want)
		}
	}
}

func TestIDBefore(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"1-0", "2-0", true}, {"2-0", "1-5", false}, {"5-1", "5-2", true}, {"5-2", "5-2", false},
		{"10-0", "9-0", false}, {"0-0", "1-0", true}, {"", "1-0", false}, {"x-1", "1-0", false},
	} {
		if got := idBefore(c.a, c.b); got != c.want {
			t.Errorf("idBefore(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
