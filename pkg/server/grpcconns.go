package server

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// DefaultGRPCMaxConnections bounds the gRPC listener's open connections
// when Config sets none: an idle gRPC connection holds ~17-20 KiB (its
// transport's goroutines and buffers; measured on the limiter with 4,000
// to 6,000 connections), so 4,096 stay within ~80 MiB, while a fleet of
// Envoys, a few connections each, fits.
const DefaultGRPCMaxConnections = 4096

// MetricGRPCConnectionsClosed counts the gRPC connections the server
// refused or closed to keep KURZ_GRPC_MAX_CONNECTIONS, by reason: quiet
// or full, as for HTTP (MetricHTTPConnectionsClosed).
const MetricGRPCConnectionsClosed = "kurz.grpc.connections.closed"

// grpcConnsClosedCounter is closed for the gRPC listener's guard.
func grpcConnsClosedCounter(meter metric.Meter) (func(reason string), error) {
	return closedCounter(meter, MetricGRPCConnectionsClosed,
		"gRPC connections refused or closed to keep KURZ_GRPC_MAX_CONNECTIONS, by reason: quiet (one that had sent nothing, closed for a newcomer at the cap), full (a newcomer at the cap with none quiet)",
		reasonQuiet, reasonFull)
}

// guardGRPCConns bounds lis's open connections with g as the HTTP
// listener's are bounded (connGuard), with no request to go by: a
// connection is quiet until it sends its first bytes (a gRPC client sends
// its preface as it connects) and active from then on, never closed for
// another. At the cap a newcomer closes the oldest connection that has
// sent nothing yet, or else is refused: MaxConcurrentStreams and the
// call gate bound what one connection holds, this how many a caller
// opens, and silent ones, which gRPC holds for its 120 s handshake
// timeout, cannot keep callers out. Each connection gets the
// TCP_USER_TIMEOUT gRPC gives those it accepts itself (userTimeout, its
// keepalive timeout).
func guardGRPCConns(lis net.Listener, g *connGuard, userTimeout time.Duration) net.Listener {
	return grpcGuarded{lis, g, userTimeout}
}

type grpcGuarded struct {
	net.Listener
	g           *connGuard
	userTimeout time.Duration
}

func (l grpcGuarded) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return c, err
		}
		if err := setUserTimeout(c, l.userTimeout); err != nil {
			_ = c.Close() // as gRPC refuses a connection it cannot set it on
			continue
		}
		gc := &guardedGRPCConn{Conn: c, g: l.g}
		switch victim := l.g.makeRoom(gc); victim {
		case nil:
		case gc:
			_ = c.Close() // refused: the guard never counted it open
			continue
		default:
			_ = victim.Close()
		}
		l.g.state(gc, http.StateNew)
		return gc, nil
	}
}

// guardedGRPCConn tells the guard when its connection first speaks and
// when it closes.
type guardedGRPCConn struct {
	net.Conn
	g      *connGuard
	spoke  atomic.Bool // only the transport's reader reads
	closed sync.Once
}

func (c *guardedGRPCConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && !c.spoke.Load() {
		c.spoke.Store(true)
		c.g.state(c, http.StateActive)
	}
	return n, err
}

func (c *guardedGRPCConn) Close() error {
	c.closed.Do(func() { c.g.state(c, http.StateClosed) })
	return c.Conn.Close()
}
