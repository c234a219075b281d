package redisconn

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
)

func TestTimedOut(t *testing.T) {
	slow := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("ping 127.0.0.1:7003: %w", slow), true},
		{fmt.Errorf("ping 127.0.0.1:7003: %w", refused), false},
		{errors.New("cluster state is not ok"), false},
	} {
		if got := timedOut(c.err); got != c.want {
			t.Errorf("timedOut(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
