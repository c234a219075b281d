package server

import (
	"net"
	"net/http"
	"sync"

	"golang.org/x/net/netutil"
)

// DefaultMaxConnections bounds the HTTP listener's open connections when
// HTTPLimits sets none: an idle keep-alive connection holds ~20-30 KiB
// (its goroutine and buffers), so 4,096 stay within ~130 MiB, and the file
// descriptors far from the process's limit.
const DefaultMaxConnections = 4096

// connGuard bounds the connections of an HTTP server: at max, accepting
// waits until one closes (netutil.LimitListener); from three quarters of
// max, keep-alives are off (idle connections close at once, responses end
// theirs) until fewer than half remain. Idle connections cost a stranger
// nothing to keep open for IdleTimeout, and they would otherwise fill the
// listener while its clients wait; the idle timeout itself stays longer
// than load balancers' (60 s), which reuse connections a server must not
// close under them.
type connGuard struct {
	srv *http.Server
	max int

	mu       sync.Mutex
	open     int
	shedding bool
}

// guardConns bounds srv's connections on lis to max and returns the
// listener to serve.
func guardConns(srv *http.Server, lis net.Listener, max int) net.Listener {
	g := &connGuard{srv: srv, max: max}
	srv.ConnState = g.state
	return netutil.LimitListener(lis, max)
}

func (g *connGuard) state(_ net.Conn, st http.ConnState) {
	var delta int
	switch st {
	case http.StateNew:
		delta = 1
	case http.StateClosed, http.StateHijacked:
		delta = -1
	default:
		return
	}
	g.mu.Lock()
	g.open += delta
	toggle, keepAlive := false, false
	switch {
	case !g.shedding && g.open >= g.max*3/4:
		g.shedding, toggle = true, true
	case g.shedding && g.open < g.max/2:
		g.shedding, toggle, keepAlive = false, true, true
	}
	if toggle {
		// Under g.mu, so that two toggles cannot land out of order.
		g.srv.SetKeepAlivesEnabled(keepAlive)
	}
	g.mu.Unlock()
}
