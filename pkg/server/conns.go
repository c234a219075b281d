package server

import (
	"container/list"
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
// oldest one that has sent no request yet or, failing that, the oldest
// idle between keep-alive requests for at least idleGrace; with neither,
// the newcomer itself. A stranger's silent or idle connections cost it
// nothing to hold (until ReadHeaderTimeout or IdleTimeout): at the cap
// they make room for everyone else's instead of filling the listener. A
// request being served is never cut (requests are bounded by their own
// timeouts); one still arriving on a connection the server takes for
// quiet can be, as at IdleTimeout, hence the grace for pooled keep-alive
// connections, which a client may write to at any moment. Below the cap
// nothing is closed.
type connGuard struct {
	max int

	mu    sync.Mutex
	open  int
	quiet map[net.Conn]*list.Element // of a *quietConn in fresh or idle
	// fresh holds the new connections (no request yet), idle the idle
	// keep-alive ones, each oldest first: a connection joins at the back
	// when it turns quiet, so the oldest is always at the front.
	fresh, idle list.List
}

// quietConn is a connection serving no request, since when, and the list
// it is in.
type quietConn struct {
	c     net.Conn
	since time.Time
	in    *list.List
}

// idleGrace is how long a keep-alive connection must have been idle to be
// closed for a newcomer at the cap.
var idleGrace = time.Second

// guardConns bounds srv's connections on lis to max and returns the
// listener to serve.
func guardConns(srv *http.Server, lis net.Listener, max int) net.Listener {
	g := newConnGuard(max)
	srv.ConnState = g.state
	return guardedListener{lis, g}
}

func newConnGuard(max int) *connGuard {
	return &connGuard{max: max, quiet: map[net.Conn]*list.Element{}}
}

func (g *connGuard) state(c net.Conn, st http.ConnState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch st {
	case http.StateNew:
		g.open++
		g.hush(c, &g.fresh)
	case http.StateIdle:
		g.wake(c)
		g.hush(c, &g.idle)
	case http.StateActive:
		g.wake(c)
	case http.StateClosed, http.StateHijacked:
		g.open--
		g.wake(c)
	}
}

// hush records c as quiet from now on, in l.
func (g *connGuard) hush(c net.Conn, l *list.List) {
	g.quiet[c] = l.PushBack(&quietConn{c: c, since: time.Now(), in: l})
}

// wake forgets c as quiet, if it was.
func (g *connGuard) wake(c net.Conn) {
	if e := g.quiet[c]; e != nil {
		e.Value.(*quietConn).in.Remove(e)
		delete(g.quiet, c)
	}
}

// makeRoom picks, when max are open, the connection to close for the one
// just accepted (see connGuard); nil below the cap. It takes the same
// time however many connections are open.
func (g *connGuard) makeRoom(accepted net.Conn) (victim net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open < g.max {
		return nil
	}
	if e := g.fresh.Front(); e != nil {
		victim = e.Value.(*quietConn).c
	} else if e := g.idle.Front(); e != nil && e.Value.(*quietConn).since.Before(time.Now().Add(-idleGrace)) {
		victim = e.Value.(*quietConn).c
	} else {
		return accepted
	}
	g.wake(victim)
	return victim
}

type guardedListener struct {
	net.Listener
	g *connGuard
}

func (l guardedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return c, err
		}
		victim := l.g.makeRoom(c)
		if victim == nil {
			return c, nil
		}
		_ = victim.Close() // its server goroutine sees it closed and ends
		if victim != c {
			return c, nil
		}
	}
}
