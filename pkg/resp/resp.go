// Package resp encodes Redis commands and reads reply lines (RESP2) for
// the hot paths that talk to Redis on connections of their own: the
// limiter's decision pipelines and the redirect's click stream writers.
// Everything else goes through go-redis.
package resp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
)

// AppendArray appends the header of an array of n elements (a command of
// n arguments).
func AppendArray(b []byte, n int) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, "\r\n"...)
}

// AppendCommand appends args as one command.
func AppendCommand(b []byte, args ...string) []byte {
	b = AppendArray(b, len(args))
	for _, a := range args {
		b = AppendBulk(b, a)
	}
	return b
}

// AppendBulk appends s as a bulk string.
func AppendBulk(b []byte, s string) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, "\r\n"...)
	b = append(b, s...)
	return append(b, "\r\n"...)
}

// AppendBulkInt appends v in decimal as a bulk string.
func AppendBulkInt(b []byte, v int64) []byte {
	var num [20]byte
	d := strconv.AppendInt(num[:0], v, 10)
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(d)), 10)
	b = append(b, "\r\n"...)
	b = append(b, d...)
	return append(b, "\r\n"...)
}

// ReadLine reads one CRLF-terminated reply line, without the CRLF, in r's
// buffer: valid until r's next read, never empty. A line longer than r's
// buffer is an error.
func ReadLine(r *bufio.Reader) ([]byte, error) {
	b, err := r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errors.New("redis: reply line too long")
		}
		if errors.Is(err, io.EOF) {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if len(b) < 3 || b[len(b)-2] != '\r' {
		return nil, errors.New("redis: malformed reply line")
	}
	return b[:len(b)-2], nil
}

// ParseInt reads a RESP integer: an optional minus sign and 1 to 19
// decimal digits. strconv.ParseInt would need a string, an allocation per
// line of every reply.
func ParseInt(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	switch {
	case neg && v <= 1<<63:
		return int64(-v), true // -(1<<63) wraps to itself: math.MinInt64
	case !neg && v <= math.MaxInt64:
		return int64(v), true
	}
	return 0, false
}

// ReadCommand reads one command (an array of bulk strings) as a Redis
// node reads it: what fake nodes in tests need.
func ReadCommand(r *bufio.Reader) ([]string, error) {
	head, err := ReadLine(r)
	if err != nil {
		return nil, err
	}
	n, ok := ParseInt(head[1:])
	if head[0] != '*' || !ok || n < 0 || n > 1<<20 {
		return nil, fmt.Errorf("redis: not a command: %.40q", head)
	}
	args := make([]string, n)
	for i := range args {
		h, err := ReadLine(r)
		if err != nil {
			return nil, err
		}
		size, ok := ParseInt(h[1:])
		if h[0] != '$' || !ok || size < 0 || size > 512<<20 {
			return nil, fmt.Errorf("redis: argument %d: not a bulk string: %.40q", i, h)
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		if string(b[size:]) != "\r\n" {
			return nil, fmt.Errorf("redis: argument %d: no CRLF after %d bytes", i, size)
		}
		args[i] = string(b[:size])
	}
	return args, nil
}

// Auth sends AUTH [username] password over conn and reads its answer from
// r (conn's reader), within conn's deadline: a new connection's first
// exchange. Without a password it sends nothing.
func Auth(conn net.Conn, r *bufio.Reader, username, password string) error {
	if password == "" {
		return nil
	}
	cmd := AppendCommand(nil, "AUTH", password)
	if username != "" {
		cmd = AppendCommand(nil, "AUTH", username, password)
	}
	if _, err := conn.Write(cmd); err != nil {
		return err
	}
	line, err := ReadLine(r)
	if err != nil {
		return err
	}
	switch {
	case string(line) == "+OK":
	case username == "" && strings.Contains(string(line), "called without any password configured"):
		// A password for a Redis that has none: go-redis's clients,
		// which send it in HELLO as the default user's, are let in (that
		// user takes any password), so this connection is too.
	default:
		return fmt.Errorf("redis: AUTH: %s", strings.TrimPrefix(string(line), "-"))
	}
	return nil
}

// NotServed reports whether the error reply msg (without its '-') says the
// node did not run the command and the cluster client must: a redirect
// (MOVED, ASK), a slot in migration (TRYAGAIN), or a node not ready to
// (CLUSTERDOWN, LOADING, READONLY, MASTERDOWN, BUSY: a script is running).
// Sent again through the cluster client, such a command runs once.
func NotServed(msg string) bool {
	code, _, _ := strings.Cut(msg, " ")
	switch code {
	case "MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "LOADING", "READONLY", "MASTERDOWN", "BUSY":
		return true
	}
	return false
}
