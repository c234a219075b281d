package server_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/server"
	"kurz.dev/pkg/testkit/servertest"
)

// dialFrom opens a connection to addr from the loopback address from
// (127.0.0.0/8 is all loopback on Linux): a client of its own to the
// per-client bound.
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// getFrom is the status of GET /healthz on a new connection from from,
// or the error that kept it from an answer (within 5 s).
func getFrom(t *testing.T, from, addr string) (int, error) {
	t.Helper()
	c := dialFrom(t, from, addr)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// metrics is the text of the server's /metrics.
func metrics(t *testing.T, r *servertest.Running) string {
	t.Helper()
	resp, err := http.Get(r.Ops + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A request answered without its body being read (a 404, as to a stranger
// sending to no route) is answered at once and its connection closed,
// however slowly the rest of the body comes: net/http used to read that
// rest first, the connection active, so never closed for a newcomer, until
// ReadTimeout, and one client holding the listener's every connection so
// kept everyone else out.
func TestUnreadSlowBodiesDoNotHoldTheListener(t *testing.T) {
	const max = 16
	r := start(t, server.HTTPLimits{ReadTimeout: time.Minute, MaxConnections: max})
	addr := strings.TrimPrefix(r.HTTP, "http://")
	for i := range max {
		c := dialFrom(t, "127.0.0.1", addr)
		// One byte of the 100,000 declared; the rest never comes.
		if _, err := io.WriteString(c, "POST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nx"); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("slow body %d: no answer in 5 s (%v); want a 404 at once", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || !resp.Close {
			t.Errorf("slow body %d: %d, Connection: close %v; want 404 and the connection closed", i, resp.StatusCode, resp.Close)
		}
		if _, err := br.ReadByte(); err != io.EOF {
			t.Errorf("slow body %d: connection after the answer: %v; want closed (EOF)", i, err)
		}
	}
	if code, err := getFrom(t, "127.0.0.1", addr); err != nil || code != http.StatusOK {
		t.Errorf("GET /healthz after %d slow bodies: %d %v; want 200", max, code, err)
	}
	if m := metrics(t, r); !servertest.HasSeries(m, "kurz_http_connections_closed_total", `reason="unread_body"`) {
		t.Errorf("no kurz_http_connections_closed_total{reason=\"unread_body\"} in /metrics")
	}
}

// A client holding MaxConnectionsPerClient connections, each with a
// request being served (a body that trickles to a route reading it), gets
// no more: the listener's other places stay for other clients, and the
// refusals are counted.
func TestOneClientCannotHoldEveryConnection(t *testing.T) {
	const max, perClient = 16, 4
	arrived := make(chan struct{}, max)
	r := startWith(t, server.Config{HTTP: server.HTTPLimits{ReadTimeout: time.Minute, MaxConnections: max, MaxConnectionsPerClient: perClient}}, func(s *server.Server) {
		s.Mux.HandleFunc("POST /read", func(w http.ResponseWriter, r *http.Request) {
			arrived <- struct{}{}
			_, _ = io.Copy(io.Discard, r.Body)
		})
	})
	addr := strings.TrimPrefix(r.HTTP, "http://")
	held := 0
	for range max {
		c := dialFrom(t, "127.0.0.2", addr)
		if _, err := io.WriteString(c, "POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nx"); err != nil {
			continue // refused already
		}
		select {
		case <-arrived:
			held++
		case <-closedConn(c):
		}
	}
	if held != perClient {
		t.Errorf("one client holds %d requests in flight; want %d (MaxConnectionsPerClient)", held, perClient)
	}
	if code, err := getFrom(t, "127.0.0.3", addr); err != nil || code != http.StatusOK {
		t.Errorf("another client's GET /healthz: %d %v; want 200", code, err)
	}
	if m := metrics(t, r); !servertest.HasSeries(m, "kurz_http_connections_closed_total", `reason="client_cap"`) {
		t.Errorf("no kurz_http_connections_closed_total{reason=\"client_cap\"} in /metrics")
	}
}

// closedConn is closed once the server has closed c (or 5 s passed).
func closedConn(c net.Conn) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.Read(make([]byte, 1))
	}()
	return done
}
