package server

import (
	"bufio"
	"net"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// guarded serves a handler on a listener bounded to max connections;
// /hold answers once release is closed (counts.holding counts those
// waiting). counts.accepted counts the connections the server took, and
// counts.idled their turns to idle, each once the guard has seen it.
func guarded(t *testing.T, max int) (addr string, counts *guardCounts, release chan struct{}) {
	t.Helper()
	release, counts = make(chan struct{}), &guardCounts{}
	srv := &http.Server{ReadHeaderTimeout: time.Minute, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			counts.holding.Add(1)
			<-release
		}
	})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := guardConns(srv, lis, newConnGuard(max, max, nil))
	inner := srv.ConnState
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		inner(c, st)
		switch st {
		case http.StateNew:
			counts.accepted.Add(1)
		case http.StateIdle:
			counts.idled.Add(1)
		}
	}
	go func() { _ = srv.Serve(g) }()
	t.Cleanup(func() { _ = srv.Close() })
	return lis.Addr().String(), counts, release
}

type guardCounts struct{ accepted, idled, holding atomic.Int64 }

type client struct {
	net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return client{c, bufio.NewReader(c)}
}

// get sends one keep-alive GET of path and reads its answer (within 10 s).
func (c client) get(t *testing.T, path string) error {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("GET " + path + " HTTP/1.1\r\nHost: kurz.test\r\n\r\n")); err != nil {
		return err
	}
	resp, err := http.ReadResponse(c.r, nil)
	if err == nil {
		resp.Body.Close()
	}
	return err
}

// closedByServer reports whether the server closed c (within 10 s).
func (c client) closedByServer() bool {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.r.ReadByte()
	ne, timeout := err.(net.Error)
	return err != nil && !(timeout && ne.Timeout())
}

// awaitAccepted waits until counter reaches n (10 s at most).
func awaitAccepted(t *testing.T, counter *atomic.Int64, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); counter.Load() < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d in 10 s", counter.Load(), n)
		}
		runtime.Gosched()
	}
}

// At the cap, a new connection is served at once and the oldest one that
// has sent nothing makes room for it: silent connections cannot keep
// anyone out.
func TestSilentConnectionsMakeRoomAtTheCap(t *testing.T) {
	const max = 16
	addr, counts, _ := guarded(t, max)
	var silent []client
	for range max {
		silent = append(silent, dial(t, addr))
		awaitAccepted(t, &counts.accepted, int64(len(silent)))
	}
	if err := dial(t, addr).get(t, "/"); err != nil {
		t.Fatalf("a connection past the cap of silent ones: %v; want it served", err)
	}
	if !silent[0].closedByServer() {
		t.Error("the oldest silent connection is still open after a new one came at the cap")
	}
	if err := silent[1].get(t, "/"); err != nil {
		t.Errorf("the second oldest silent connection was closed too: %v", err)
	}
}

// At the cap, the oldest idle keep-alive connection makes room (here idle
// for no time at all: no grace); below it none is closed, and one with a
// request in flight never is.
func TestIdleConnectionsMakeRoomAtTheCapActiveOnesNever(t *testing.T) {
	defer func(g time.Duration) { idleGrace = g }(idleGrace)
	idleGrace = 0
	const max = 16
	addr, counts, release := guarded(t, max)
	// Requests in flight on the oldest half.
	held := make(chan error, max/2)
	for i := range max / 2 {
		c := dial(t, addr)
		awaitAccepted(t, &counts.accepted, int64(i+1))
		go func() { held <- c.get(t, "/hold") }()
	}
	awaitAccepted(t, &counts.holding, max/2) // all in flight
	// Idle in turn: the client may read its answer before the server's
	// goroutine marks the connection idle.
	var idle []client
	for range max / 2 {
		c := dial(t, addr)
		if err := c.get(t, "/"); err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
		awaitAccepted(t, &counts.idled, int64(len(idle)))
	}
	awaitAccepted(t, &counts.accepted, max)
	if err := idle[len(idle)-1].get(t, "/"); err != nil {
		t.Fatalf("an idle connection under the cap: %v; want it kept", err)
	}
	for i := range 3 {
		if err := dial(t, addr).get(t, "/"); err != nil {
			t.Fatalf("connection %d past the cap: %v; want it served", i+1, err)
		}
		if !idle[i].closedByServer() {
			t.Fatalf("idle connection %d still open after %d came past the cap; want the oldest idle ones closed", i, i+1)
		}
	}
	close(release)
	for range max / 2 {
		if err := <-held; err != nil {
			t.Errorf("a request in flight at the cap: %v; want it answered", err)
		}
	}
}

// A connection that has sent nothing goes before an idle keep-alive one
// (which a client may be writing a request to), and an idle one only after
// idleGrace: with neither at the cap, the newcomer is closed instead.
func TestSilentConnectionsGoFirstIdleOnesAfterTheirGrace(t *testing.T) {
	defer func(g time.Duration) { idleGrace = g }(idleGrace)
	idleGrace = time.Hour
	const max = 16
	addr, counts, _ := guarded(t, max)
	var idle, silent []client
	for range max / 2 {
		c := dial(t, addr)
		if err := c.get(t, "/"); err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	for range max / 2 {
		silent = append(silent, dial(t, addr))
	}
	awaitAccepted(t, &counts.accepted, max)
	for i := range max / 2 {
		if err := dial(t, addr).get(t, "/"); err != nil {
			t.Fatalf("newcomer %d at the cap: %v; want it served", i+1, err)
		}
		if !silent[i].closedByServer() {
			t.Fatalf("silent connection %d still open after newcomer %d; want the silent ones closed first", i, i+1)
		}
	}
	// Only idle ones (within their grace) and the served newcomers, now
	// idle too, remain: the next newcomer is closed, no idle one.
	late := dial(t, addr)
	if err := late.get(t, "/"); err == nil {
		t.Error("a newcomer at a cap of connections idle within their grace was served; want it closed")
	}
	for i, c := range idle {
		if err := c.get(t, "/"); err != nil {
			t.Errorf("idle connection %d within its grace: %v; want it kept", i, err)
		}
	}
}

// nopConn is a connection the guard only keeps track of.
type nopConn struct {
	net.Conn
	id int
}

// RemoteAddr is an address of the connection's own.
func (c *nopConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(10, byte(c.id>>16), byte(c.id>>8), byte(c.id)), Port: 1}
}

// BenchmarkAcceptAtTheCap is one accept during a flood of new connections
// with max open: the guard picks a victim, which closes, and the
// newcomer becomes the newest quiet connection.
func BenchmarkAcceptAtTheCap(b *testing.B) {
	for _, quiet := range []http.ConnState{http.StateNew, http.StateIdle} {
		b.Run(quiet.String(), func(b *testing.B) {
			g := newConnGuard(DefaultMaxConnections, DefaultMaxConnections, nil)
			for i := range DefaultMaxConnections {
				c := &nopConn{id: i}
				g.state(c, http.StateNew)
				if quiet == http.StateIdle {
					g.state(c, http.StateActive)
					g.state(c, http.StateIdle)
				}
			}
			b.ResetTimer()
			for i := range b.N {
				c := &nopConn{id: DefaultMaxConnections + i}
				if v := g.makeRoom(c); v != nil && v != c {
					g.state(v, http.StateClosed)
				}
				if quiet == http.StateNew {
					g.state(c, http.StateNew)
				}
			}
		})
	}
}
