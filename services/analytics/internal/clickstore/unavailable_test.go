package clickstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2"
)

func TestUnreachable(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	tests := map[string]struct {
		err  error
		want bool
	}{
		"connection refused":   {fmt.Errorf("query: %w", refused), true},
		"connection lost":      {fmt.Errorf("read: %w", io.EOF), true},
		"connection reset":     {syscall.ECONNRESET, true},
		"no connection free":   {clickhouse.ErrAcquireConnTimeout, true},
		"connection closed":    {clickhouse.ErrConnectionClosed, true},
		"an answered error":    {&clickhouse.Exception{Code: 60, Message: "Table kurz.x does not exist"}, false},
		"a shard unreachable":  {fmt.Errorf("query: %w", &clickhouse.Exception{Code: 279, Message: "All connection tries failed"}), true},
		"every replica stale":  {&clickhouse.Exception{Code: 369, Message: "Could not find enough connections to up-to-date replicas"}, true},
		"the caller's timeout": {fmt.Errorf("query: %w", context.DeadlineExceeded), false},
		"the caller gave up":   {context.Canceled, false},
		"anything else":        {errors.New("scan: converting String to *uint32"), false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := unreachable(tc.err); got != tc.want {
				t.Errorf("unreachable(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
