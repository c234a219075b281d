package redirector

import (
	"errors"
	"fmt"
	"testing"
)

// replyError is an error reply from Redis, as go-redis returns one.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// A MOVED or ASK answer is a refused INCR, to count again on the node it
// names; any other error, a reply or not, is not.
func TestRedirection(t *testing.T) {
	for _, tc := range []struct {
		err  error
		ok   bool
		ask  bool
		addr string
	}{
		{replyError("MOVED 5649 127.0.0.1:7004"), true, false, "127.0.0.1:7004"},
		{fmt.Errorf("redis incr v:abc: %w", replyError("ASK 5649 127.0.0.1:7004")), true, true, "127.0.0.1:7004"},
		{replyError("TRYAGAIN Multiple keys request during rehashing of slot"), false, false, ""},
		{replyError("CLUSTERDOWN The cluster is down"), false, false, ""},
		{errors.New("MOVED 5649 127.0.0.1:7004"), false, false, ""}, // not a reply: may have run
		{errors.New("i/o timeout"), false, false, ""},
		{nil, false, false, ""},
	} {
		ask, addr, ok := redirection(tc.err)
		if ok != tc.ok || ask != tc.ask || addr != tc.addr {
			t.Errorf("redirection(%v) = ask %v, %q, %v; want ask %v, %q, %v", tc.err, ask, addr, ok, tc.ask, tc.addr, tc.ok)
		}
	}
}
