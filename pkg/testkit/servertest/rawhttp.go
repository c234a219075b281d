package servertest

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// Tests of what a broken or hostile client can do to an HTTP listener speak
// to it byte by byte: a real client library would refuse to send most of it.

// RawResponse is what the server sent on one raw connection, and whether and
// when it closed the connection.
type RawResponse struct {
	// Status is the status code of the first response; 0 if none came.
	Status int
	// Header and Body are the first response's; Body is cut at 64 KiB.
	Header http.Header
	Body   string
	// Bytes counts everything the server sent.
	Bytes int
	// Closed: the server closed the connection (a read ended in EOF or a
	// reset) before the wait ran out.
	Closed bool
	// After is the time from the dial to the close (or to giving up).
	After time.Duration
}

// MalformedRequest is one request no client library would send, and the
// status net/http answers it with before any handler runs.
type MalformedRequest struct {
	Name string
	Raw  string
	Want int
}

// MalformedRequests are broken request lines and header blocks; every
// service answers them the same way, since net/http refuses them before the
// service's handler sees them.
var MalformedRequests = []MalformedRequest{
	{"broken request line", "GARBAGE\r\n\r\n", http.StatusBadRequest},
	{"request line without a version", "GET /\r\nHost: x\r\n\r\n", http.StatusBadRequest},
	{"invalid method", "G@T / HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusBadRequest},
	{"URI without a leading slash", "GET no-slash HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusBadRequest},
	{"control byte in the URI", "GET /a\x01b HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusBadRequest},
	{"unsupported HTTP version", "GET / HTTP/2.7\r\nHost: x\r\n\r\n", http.StatusHTTPVersionNotSupported},
	{"header line without a colon", "GET / HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n", http.StatusBadRequest},
	{"space before the colon", "GET / HTTP/1.1\r\nHost : x\r\n\r\n", http.StatusBadRequest},
	{"no Host in HTTP/1.1", "GET / HTTP/1.1\r\n\r\n", http.StatusBadRequest},
	{"two Host fields", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", http.StatusBadRequest},
	{"conflicting Content-Length", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", http.StatusBadRequest},
	{"unknown Transfer-Encoding", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", http.StatusNotImplemented},
	{"2 MiB header", "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("b", 2<<20) + "\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge},
}

// RawExchange dials addr, writes req (while reading, so an answer sent
// before the server has read everything is heard) and reads until the
// server closes the connection or within has passed.
func RawExchange(addr, req string, within time.Duration) (RawResponse, error) {
	return rawConn(addr, within, func(c net.Conn, stop <-chan struct{}) {
		_, _ = io.WriteString(c, req)
	})
}

// Trickle dials addr, writes head at once, then drip one byte at a time,
// one every interval (starting over when drip runs out), until the server
// closes the connection or within has passed: a slowloris header or a slow
// body.
func Trickle(addr, head, drip string, every, within time.Duration) (RawResponse, error) {
	return rawConn(addr, within, func(c net.Conn, stop <-chan struct{}) {
		if _, err := io.WriteString(c, head); err != nil || drip == "" {
			return
		}
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if _, err := c.Write([]byte{drip[i%len(drip)]}); err != nil {
				return
			}
		}
	})
}

func rawConn(addr string, within time.Duration, write func(c net.Conn, stop <-chan struct{})) (RawResponse, error) {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, within)
	if err != nil {
		return RawResponse{}, err
	}
	stop := make(chan struct{})
	wrote := make(chan struct{})
	go func() { defer close(wrote); write(c, stop) }()
	defer func() {
		// Closing the connection ends a write the server no longer reads.
		close(stop)
		_ = c.Close()
		<-wrote
	}()

	if err := c.SetReadDeadline(start.Add(within)); err != nil {
		return RawResponse{}, err
	}
	var got bytes.Buffer
	buf := make([]byte, 32<<10)
	var res RawResponse
	for {
		n, err := c.Read(buf)
		got.Write(buf[:n])
		if err == nil {
			continue
		}
		res.After = time.Since(start)
		var ne net.Error
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
			res.Closed = true
		case errors.As(err, &ne) && ne.Timeout():
		default:
			return res, err
		}
		break
	}
	res.Bytes = got.Len()
	if resp, err := http.ReadResponse(bufio.NewReader(&got), nil); err == nil {
		res.Status, res.Header = resp.StatusCode, resp.Header
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		res.Body = string(body)
		_ = resp.Body.Close()
	}
	return res, nil
}

// AwaitGoroutines polls runtime.NumGoroutine until it is at most atMost or
// within has passed, and returns the last count and whether it got there.
// Connections the server has closed take a moment to end their goroutines;
// this waits for that instead of guessing a sleep.
func AwaitGoroutines(atMost int, within time.Duration) (int, bool) {
	deadline := time.Now().Add(within)
	for {
		n := runtime.NumGoroutine()
		if n <= atMost {
			return n, true
		}
		if time.Now().After(deadline) {
			return n, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TrickleMany runs n Trickles at once (see Trickle) and returns their
// results when all have ended, in no particular order.
func TrickleMany(n int, addr, head, drip string, every, within time.Duration) ([]RawResponse, error) {
	type result struct {
		r   RawResponse
		err error
	}
	results := make(chan result, n)
	for range n {
		go func() {
			r, err := Trickle(addr, head, drip, every, within)
			results <- result{r, err}
		}()
	}
	out := make([]RawResponse, 0, n)
	var errs []error
	for range n {
		res := <-results
		if res.err != nil {
			errs = append(errs, res.err)
			continue
		}
		out = append(out, res.r)
	}
	return out, errors.Join(errs...)
}

// AfterRange is the earliest and latest After of rs, rounded to 10 ms.
func AfterRange(rs []RawResponse) (lo, hi time.Duration) {
	for i, r := range rs {
		if i == 0 || r.After < lo {
			lo = r.After
		}
		hi = max(hi, r.After)
	}
	return lo.Round(10 * time.Millisecond), hi.Round(10 * time.Millisecond)
}
