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

// request sends one keep-alive GET on c and reads its response.
func request(t *testing.T, c net.Conn, r *bufio.Reader) *http.Response {
	t.Helper()
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: kurz.test\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// A listener's connections are bounded: from three quarters of the cap,
// idle keep-alive connections are closed and answers end theirs; below
// half, keep-alives are back; at the cap, a new connection is served only
// once another closes.
func TestHTTPConnectionsAreBounded(t *testing.T) {
	const max = 16
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}), ReadHeaderTimeout: time.Minute}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	guarded := guardConns(srv, lis, max)
	var accepted atomic.Int64
	inner := srv.ConnState
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateNew {
			accepted.Add(1)
		}
		inner(c, st)
	}
	go func() { _ = srv.Serve(guarded) }()
	t.Cleanup(func() { _ = srv.Close() })
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c, bufio.NewReader(c)
	}

	// Under three quarters: idle connections stay open.
	var idle []net.Conn
	var readers []*bufio.Reader
	for range max*3/4 - 1 {
		c, r := dial()
		if resp := request(t, c, r); resp.Close {
			t.Fatalf("answer %d of %d connections ends its connection", len(idle)+1, max)
		}
		idle, readers = append(idle, c), append(readers, r)
	}
	// The one that reaches three quarters: its answer ends it, and the
	// idle ones are closed by the server.
	c, r := dial()
	if resp := request(t, c, r); !resp.Close {
		t.Error("the answer at three quarters of the cap keeps its connection")
	}
	for i, c := range idle {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := readers[i].ReadByte(); err == nil {
			t.Fatalf("idle connection %d read a byte, want it closed by the server", i)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("idle connection %d still open 10 s after the shedding began", i)
		}
		_ = c.Close()
	}
	_ = c.Close()

	// Below half again: keep-alives are back.
	// (The server counts a connection closed once it has read its end.)
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, r := dial()
		resp := request(t, c, r)
		_ = c.Close()
		if !resp.Close {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("answers still end their connections 10 s after the others closed")
		}
	}

	// At the cap: a new connection is accepted only once one closes.
	var held []net.Conn
	before := accepted.Load()
	for range max {
		c, _ := dial()
		held = append(held, c)
	}
	for deadline := time.Now().Add(10 * time.Second); accepted.Load() < before+max; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d connections accepted in 10 s", accepted.Load()-before, max)
		}
		runtime.Gosched()
	}
	late, lr := dial()
	done := make(chan *http.Response, 1)
	go func() {
		if _, err := late.Write([]byte("GET / HTTP/1.1\r\nHost: kurz.test\r\n\r\n")); err != nil {
			return
		}
		resp, err := http.ReadResponse(lr, nil)
		if err == nil {
			done <- resp
		}
	}()
	// Served at once without the cap (well under a millisecond here).
	select {
	case <-done:
		t.Fatal("a connection past the cap was served while the cap's were open")
	case <-time.After(300 * time.Millisecond):
	}
	_ = held[0].Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection past the cap was not served within 10 s of one closing")
	}
}
