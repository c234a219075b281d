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
	fresh map[net.Conn]time.Time // new connections (no request yet), since when
	idle  map[net.Conn]time.Time // idle keep-alive connections, since when
}

// idleGrace is how long a keep-alive connection must have been idle to be
// closed for a newcomer at the cap.
var idleGrace = time.Second

// guardConns bounds srv's connections on lis to max and returns the
// listener to serve.
func guardConns(srv *http.Server, lis net.Listener, max int) net.Listener {
	g := &connGuard{max: max, fresh: map[net.Conn]time.Time{}, idle: map[net.Conn]time.Time{}}
	srv.ConnState = g.state
	return guardedListener{lis, g}
}

func (g *connGuard) state(c net.Conn, st http.ConnState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch st {
	case http.StateNew:
		g.open++
		g.fresh[c] = time.Now()
	case http.StateIdle:
		g.idle[c] = time.Now()
	case http.StateActive:
		delete(g.fresh, c)
		delete(g.idle, c)
	case http.StateClosed, http.StateHijacked:
		g.open--
		delete(g.fresh, c)
		delete(g.idle, c)
	}
}

// makeRoom picks, when max are open, the connection to close for the one
// just accepted (see connGuard); nil below the cap.
func (g *connGuard) makeRoom(accepted net.Conn) (victim net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open < g.max {
		return nil
	}
	oldest := func(m map[net.Conn]time.Time, before time.Time) net.Conn {
		var pick net.Conn
		for c, since := range m {
			if since.Before(before) {
				pick, before = c, since
			}
		}
		return pick
	}
	if victim = oldest(g.fresh, time.Now().Add(time.Hour)); victim != nil {
		delete(g.fresh, victim)
	} else if victim = oldest(g.idle, time.Now().Add(-idleGrace)); victim != nil {
		delete(g.idle, victim)
	} else {
		victim = accepted
	}
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
