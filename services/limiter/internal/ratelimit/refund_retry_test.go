//go:build integration

package ratelimit

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/redisconn"
)

// replyLosingConn breaks the connection instead of reading the reply of
// the first refund script written on it once armed reaches it: the script
// ran on Redis, the client sees EOF.
type replyLosingConn struct {
	net.Conn
	armed *atomic.Int64
	lose  bool
}

func (c *replyLosingConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("refund")) && c.armed.Add(-1) == 0 {
		c.lose = true
	}
	return c.Conn.Write(b)
}

func (c *replyLosingConn) Read(b []byte) (int, error) {
	if c.lose {
		// The script's reply is on its way: wait for it, then drop it.
		if _, err := c.Conn.Read(b); err != nil {
			return 0, err
		}
		_ = c.Conn.Close()
		return 0, io.EOF
	}
	return c.Conn.Read(b)
}

// A refund whose reply is lost is not sent again: run twice it would hand
// back units that were used. Rule a (10 an hour per user) consumes for a
// request that rule b (1 an hour per ip) denies, and the refund's reply
// never arrives; the user still gets exactly 10 in all. Through the
// limiter's client (redisconn.NoRetries); go-redis's default resends the
// script after the broken connection and admits an 11th.
func TestALostRefundReplyIsNotSentAgain(t *testing.T) {
	var cfg redisconn.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	armed := &atomic.Int64{}
	armed.Store(1 << 40) // disarmed
	d := &net.Dialer{Timeout: time.Second}
	rdb, err := redisconn.New(context.Background(), cfg, redisconn.NoRetries, redisconn.SocketTimeouts(time.Second),
		redisconn.Dialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &replyLosingConn{Conn: c, armed: armed}, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	e := engine(t, rdb, `
domains:
  refundonce:
    rules:
      - {name: a, key: [user], algorithm: fixed_window, limit: 10, window: 1h, failure_mode: open}
      - {name: b, key: [ip], algorithm: fixed_window, limit: 1, window: 1h, failure_mode: open}
`, Options{Timeout: 100 * time.Millisecond, AutoPipeline: true})
	ctx := context.Background()
	user, ip := unique(t)+"-u", unique(t)+"-ip"
	if !e.Check(ctx, "refundonce", map[string]string{"ip": ip}, 1).GetAllowed() {
		t.Fatal("the ip's one request was denied")
	}
	granted := 0
	for range 5 {
		if e.Check(ctx, "refundonce", map[string]string{"user": user}, 1).GetAllowed() {
			granted++
		}
	}
	armed.Store(1) // the next refund's reply is lost
	if e.Check(ctx, "refundonce", map[string]string{"user": user, "ip": ip}, 1).GetAllowed() {
		t.Fatal("a request over the ip's limit was allowed")
	}
	e.Wait() // the refund has run (once, or twice)
	if armed.Load() > 0 {
		t.Fatal("no refund was sent: the test tested nothing")
	}
	for range 20 {
		if e.Check(ctx, "refundonce", map[string]string{"user": user}, 1).GetAllowed() {
			granted++
		}
	}
	if granted != 10 {
		t.Errorf("the user was granted %d of a limit of 10 after a refund whose reply was lost", granted)
	}
}
