package server

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// DefaultMaxConnections bounds the HTTP listener's open connections when
// HTTPLimits sets none: an idle keep-alive connection holds ~20-30 KiB
// (its goroutine and buffers), so 4,096 stay within ~130 MiB, and the file
// descriptors far from the process's limit.
const DefaultMaxConnections = 4096

// connGuard bounds the connections of an HTTP server without ever keeping
// a new one waiting: a connection accepted while max are open closes the
// oldest quiet one, one that has sent nothing yet or sits idle between
// keep-alive requests. A stranger's silent or idle connections cost it
// nothing to hold (until ReadHeaderTimeout or IdleTimeout): at the cap
// they make room for everyone else's instead of filling the listener. A
// connection with a request in flight is never closed (requests are
// bounded by their own timeouts). Below the cap nothing is closed: a
// load balancer's pooled connections may be written to at any moment.
type connGuard struct {
	max int

	mu    sync.Mutex
	open  int
	quiet map[net.Conn]time.Time // new or idle connections, since when
}

// guardConns bounds srv's connections on lis to max and returns the
// listener to serve.
func guardConns(srv *http.Server, lis net.Listener, max int) net.Listener {
	g := &connGuard{max: max, quiet: map[net.Conn]time.Time{}}
	srv.ConnState = g.state
	return guardedListener{lis, g}
}

func (g *connGuard) state(c net.Conn, st http.ConnState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch st {
	case http.StateNew:
		g.open++
		g.quiet[c] = time.Now()
	case http.StateIdle:
		g.quiet[c] = time.Now()
	case http.StateActive:
		delete(g.quiet, c)
	case http.StateClosed, http.StateHijacked:
		g.open--
		delete(g.quiet, c)
	}
}

// makeRoom closes the oldest quiet connection when max are open.
func (g *connGuard) makeRoom() {
	g.mu.Lock()
	var victim net.Conn
	if g.open >= g.max {
		var oldest time.Time
		for c, since := range g.quiet {
			if victim == nil || since.Before(oldest) {
				victim, oldest = c, since
			}
		}
		delete(g.quiet, victim)
	}
	g.mu.Unlock()
	if victim != nil {
		_ = victim.Close() // its server goroutine sees it closed and ends
	}
}

type guardedListener struct {
	net.Listener
	g *connGuard
}

func (l guardedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.g.makeRoom()
	}
	return c, err
}
