package server

import (
	"container/list"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"kurz.dev/pkg/clientip"
)

// DefaultMaxConnections bounds the HTTP listener's open connections when
// HTTPLimits sets none: an idle keep-alive connection holds ~20-30 KiB
// (its goroutine and buffers), so 4,096 stay within ~130 MiB, and the file
// descriptors far from the process's limit.
const DefaultMaxConnections = 4096

// DefaultMaxConnectionsPerClient bounds one client's open connections on
// the HTTP listener when HTTPLimits sets none: a browser opens 6 to a
// host, a busy NAT a few dozen, and one address cannot then hold more than
// a sixteenth of DefaultMaxConnections.
const DefaultMaxConnectionsPerClient = 256

// MetricHTTPConnectionsClosed counts the HTTP connections the server
// refused or closed to keep its bounds, by reason (see the reason*
// constants).
const MetricHTTPConnectionsClosed = "kurz.http.connections.closed"

// The reasons of MetricHTTPConnectionsClosed.
const (
	// reasonQuiet: a quiet connection closed for a newcomer at the cap.
	reasonQuiet = "quiet"
	// reasonFull: a newcomer refused at the cap, none being quiet.
	reasonFull = "full"
	// reasonClientCap: a newcomer refused, its client holding
	// MaxConnectionsPerClient already.
	reasonClientCap = "client_cap"
	// reasonUnreadBody: closed with the answer to a request whose body
	// the handler did not read to its end (closeUnreadBodies).
	reasonUnreadBody = "unread_body"
)

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
//
// Active connections are never closed, so one client holding many of
// them (requests whose bodies it trickles, up to ReadTimeout each) could
// still fill the listener: a client (an address, an IPv6 client by its
// prefix) may hold at most perClient, and the next one it opens is
// refused. The peers the service trusts as its proxies carry many
// clients' requests and are not capped.
type connGuard struct {
	max, perClient int
	// closed counts a connection refused or closed, by reason.
	closed func(reason string)

	mu    sync.Mutex
	open  int
	quiet map[net.Conn]*list.Element // of a *quietConn in fresh or idle
	// fresh holds the new connections (no request yet), idle the idle
	// keep-alive ones, each oldest first: a connection joins at the back
	// when it turns quiet, so the oldest is always at the front.
	fresh, idle list.List
	// clients counts the open connections of each capped client (by
	// clientKey); keying and proxy tell a connection's client.
	clients map[string]int
	keying  clientip.Keying
	proxy   func(netip.Addr) bool
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

// guardConns bounds srv's connections on lis with g and returns the
// listener to serve.
func guardConns(srv *http.Server, lis net.Listener, g *connGuard) net.Listener {
	srv.ConnState = g.state
	return guardedListener{lis, g}
}

// newConnGuard bounds the connections to max, perClient of them for one
// client (perClient >= max: no such bound); closed, if not nil, counts
// those it refuses or closes.
func newConnGuard(max, perClient int, closed func(reason string)) *connGuard {
	if closed == nil {
		closed = func(string) {}
	}
	return &connGuard{max: max, perClient: perClient, closed: closed, quiet: map[net.Conn]*list.Element{}, clients: map[string]int{}}
}

// connsClosedCounter is closed for newConnGuard, counting in
// MetricHTTPConnectionsClosed.
func connsClosedCounter(meter metric.Meter) (func(reason string), error) {
	return closedCounter(meter, MetricHTTPConnectionsClosed,
		"HTTP connections refused or closed to keep the listener's bounds, by reason: quiet (closed for a newcomer at KURZ_HTTP_MAX_CONNECTIONS), full (a newcomer at the cap with none quiet), client_cap (KURZ_HTTP_MAX_CONNECTIONS_PER_CLIENT), unread_body (closed with the answer to a request whose body was not read)",
		reasonQuiet, reasonFull, reasonClientCap, reasonUnreadBody)
}

// closedCounter counts in the counter name the connections a guard
// refuses or closes, by one of reasons.
func closedCounter(meter metric.Meter, name, description string, reasons ...string) (func(reason string), error) {
	n, err := meter.Int64Counter(name, metric.WithDescription(description), metric.WithUnit("{connection}"))
	if err != nil {
		return nil, fmt.Errorf("connection metrics: %w", err)
	}
	sets := map[string]metric.AddOption{}
	for _, r := range reasons {
		sets[r] = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", r)))
	}
	return func(reason string) { n.Add(context.Background(), 1, sets[reason]) }, nil
}

// keyClients sets how the guard tells a connection's client: an IPv6
// address by keying's prefix, and proxy's peers not at all.
func (g *connGuard) keyClients(keying clientip.Keying, proxy func(netip.Addr) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.keying, g.proxy = keying, proxy
}

// clientKey is the client of c; false for a client not capped (a trusted
// proxy, or an address the guard cannot read).
func (g *connGuard) clientKey(c net.Conn) (string, bool) {
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return "", false
	}
	a := ap.Addr().Unmap()
	if g.proxy != nil && g.proxy(a) {
		return "", false
	}
	return g.keying.Key(a), true
}

func (g *connGuard) state(c net.Conn, st http.ConnState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch st {
	case http.StateNew:
		g.open++
		if k, ok := g.clientKey(c); ok {
			g.clients[k]++
		}
		g.hush(c, &g.fresh)
	case http.StateIdle:
		g.wake(c)
		g.hush(c, &g.idle)
	case http.StateActive:
		g.wake(c)
	case http.StateClosed, http.StateHijacked:
		g.open--
		if k, ok := g.clientKey(c); ok {
			if g.clients[k]--; g.clients[k] <= 0 {
				delete(g.clients, k)
			}
		}
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

// makeRoom picks the connection to close for the one just accepted (see
// connGuard): accepted itself when its client holds perClient already,
// else, when max are open, a quiet one or accepted; nil when there is
// room. It takes the same time however many connections are open.
func (g *connGuard) makeRoom(accepted net.Conn) (victim net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.perClient < g.max {
		if k, ok := g.clientKey(accepted); ok && g.clients[k] >= g.perClient {
			g.closed(reasonClientCap)
			return accepted
		}
	}
	if g.open < g.max {
		return nil
	}
	if e := g.fresh.Front(); e != nil {
		victim = e.Value.(*quietConn).c
	} else if e := g.idle.Front(); e != nil && e.Value.(*quietConn).since.Before(time.Now().Add(-idleGrace)) {
		victim = e.Value.(*quietConn).c
	} else {
		g.closed(reasonFull)
		return accepted
	}
	g.closed(reasonQuiet)
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

// closeUnreadBodies ends, with its answer, the connection of a request
// whose body h did not read to its end. net/http would otherwise read
// what is left of it (up to 256 KiB), before it sends the answer and again
// as it closes the body, to keep the connection for the next request: a
// client trickling that body held the connection, active and so never
// closed for a newcomer, until ReadTimeout, and one stranger with enough
// such requests (to any route that answers without reading, a 404 or a
// 401) kept everyone else out. Moving the read deadline to now ends
// those reads at once: net/http answers with "Connection: close" and
// closes. closed counts the connections so ended.
func closeUnreadBodies(h http.Handler, closed func(reason string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			h.ServeHTTP(w, r)
			return
		}
		body := &watchedBody{ReadCloser: r.Body, want: r.ContentLength}
		r.Body = body
		h.ServeHTTP(w, r)
		// net/http looks at the body's own type after the handler.
		r.Body = body.ReadCloser
		if !body.read.Load() && http.NewResponseController(w).SetReadDeadline(time.Now()) == nil {
			closed(reasonUnreadBody)
		}
	})
}

// watchedBody is a request body that tells whether it was read to its
// end: to io.EOF, or as many bytes as its Content-Length (a JSON decoder
// stops there).
type watchedBody struct {
	io.ReadCloser
	want int64 // the Content-Length; -1 when unknown (chunked)
	got  int64
	read atomic.Bool
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.got += int64(n)
	if err == io.EOF || (b.want >= 0 && b.got >= b.want) {
		b.read.Store(true)
	}
	return n, err
}
