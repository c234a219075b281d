package redisconn_test

import (
	"bufio"
	"context"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/testkit/resptest"
)

func TestNewNamesTheVariableWhenUnreachable(t *testing.T) {
	_, err := redisconn.New(context.Background(), redisconn.Config{
		Addrs: []string{"127.0.0.1:1"}, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond, PoolSize: 1,
	})
	if err == nil || !strings.Contains(err.Error(), "KURZ_REDIS_ADDRS") {
		t.Fatalf("got %v, want an error naming KURZ_REDIS_ADDRS", err)
	}
}

// Settings go-redis cannot use are refused by name before any connection:
// a negative pool size panicked inside go-redis, a negative timeout meant
// none.
func TestNewRefusesUnusableSettingsByName(t *testing.T) {
	_, err := redisconn.New(context.Background(), redisconn.Config{
		Addrs: []string{"127.0.0.1:1"}, PoolSize: -5, DialTimeout: time.Second, ReadTimeout: -1, WriteTimeout: time.Second,
	})
	if err == nil || !strings.Contains(err.Error(), "KURZ_REDIS_POOL_SIZE=-5") || !strings.Contains(err.Error(), "KURZ_REDIS_READ_TIMEOUT") {
		t.Fatalf("got %v, want an error naming KURZ_REDIS_POOL_SIZE and KURZ_REDIS_READ_TIMEOUT", err)
	}
}

// StartUnreachable starts through an outage (nothing listening), not
// through a misconfiguration: a peer that answers, but not as a usable
// cluster (here every command refused, as a Redis without cluster mode
// refuses CLUSTER INFO), still fails the start.
func TestStartUnreachableOnlyThroughAnOutage(t *testing.T) {
	cfg := redisconn.Config{DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, PoolSize: 1}
	started := false
	start := redisconn.StartUnreachable(func(error) { started = true })

	cfg.Addrs = []string{"127.0.0.1:1"} // nothing listens
	c, err := redisconn.New(context.Background(), cfg, start)
	if err != nil || c == nil || !started {
		t.Fatalf("nothing listening: client %v, err %v, reported %v; want a client and the outage reported", c, err, started)
	}
	_ = c.Close()

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				// One refusal per command: a command is a RESP array, a
				// line starting with '*' (no argument here starts so).
				r := bufio.NewReader(conn)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if strings.HasPrefix(line, "*") {
						if _, err := conn.Write([]byte("-ERR This instance has cluster support disabled\r\n")); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
	started = false
	cfg.Addrs = []string{lis.Addr().String()}
	if c, err := redisconn.New(context.Background(), cfg, start); err == nil || started {
		if c != nil {
			_ = c.Close()
		}
		t.Fatalf("a Redis that is no cluster: err %v, reported as an outage %v; want the start to fail", err, started)
	}
}

// With KURZ_REDIS_TLS the cluster client speaks TLS (the node's certificate
// verified against KURZ_REDIS_TLS_CA_FILE): the password travels inside it.
// Without, a TLS node reads no command; a CA file that is not one is
// refused by name.
func TestNewSpeaksTLS(t *testing.T) {
	node, caFile := resptest.StartTLS(t, func(args []string) string { return "-ERR not a cluster\r\n" })
	cfg := redisconn.Config{Addrs: []string{node.Addr()}, Password: "s3cret", DialTimeout: time.Second,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, PoolSize: 1}
	plain := cfg
	_, _ = redisconn.New(context.Background(), plain)
	if cmds := node.Commands(); len(cmds) != 0 {
		t.Fatalf("a plain client's commands were read by a TLS node: %q", cmds)
	}
	cfg.TLS, cfg.TLSCAFile = true, caFile
	_, _ = redisconn.New(context.Background(), cfg) // not a cluster: the start fails, after the hello
	if cmds := node.Commands(); !slices.ContainsFunc(cmds, func(c []string) bool { return slices.Contains(c, "s3cret") }) {
		t.Errorf("over TLS the node read %q, want the password in a command", cmds)
	}
	plain.TLSCAFile = caFile // a CA named, TLS not asked for: refused, not clear text
	if _, err := redisconn.New(context.Background(), plain); err == nil || !strings.Contains(err.Error(), "KURZ_REDIS_TLS_CA_FILE is set without KURZ_REDIS_TLS=true") {
		t.Errorf("a CA file without TLS: %v, want it refused by name", err)
	}
	cfg.TLSCAFile = filepath.Join(t.TempDir(), "none.pem")
	if _, err := redisconn.New(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "KURZ_REDIS_TLS_CA_FILE") {
		t.Errorf("a missing CA file: %v, want an error naming KURZ_REDIS_TLS_CA_FILE", err)
	}
}

// The client reloads its view of the cluster every few seconds, not
// go-redis's 60 s: after a master failover it would otherwise send that
// master's commands to the dead node for up to a minute.
func TestClusterStateReloadsWithinSeconds(t *testing.T) {
	cfg := redisconn.Config{Addrs: []string{"127.0.0.1:1"}, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, PoolSize: 1}
	c, err := redisconn.New(context.Background(), cfg, redisconn.StartUnreachable(func(error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.Options().ClusterStateReloadInterval; got <= 0 || got > 5*time.Second {
		t.Errorf("ClusterStateReloadInterval %v, want a few seconds (at most 5s)", got)
	}
}

// An address without a port was taken, and the limiter started "without
// Redis" for good, every decision by its rule's failure mode.
func TestCheckRefusesAnAddressWithoutAPort(t *testing.T) {
	err := redisconn.Config{
		Addrs: []string{"127.0.0.1:7001", "127.0.0.1"}, PoolSize: 1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
	}.Check()
	if err == nil || !strings.Contains(err.Error(), `KURZ_REDIS_ADDRS: "127.0.0.1"`) || !strings.Contains(err.Error(), "host:port") {
		t.Fatalf("got %v, want an error naming KURZ_REDIS_ADDRS, the address and host:port", err)
	}
}

// A Redis URL in KURZ_REDIS_ADDRS (redis://:pw@host:6379) started the
// limiter "without Redis" and logged the password with every dial.
func TestCheckRefusesAURLWithoutEchoingItsPassword(t *testing.T) {
	err := redisconn.Config{
		Addrs: []string{"redis://:hunter2@127.0.0.1:7001"}, PoolSize: 1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
	}.Check()
	if err == nil || !strings.Contains(err.Error(), "KURZ_REDIS_ADDRS") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("got %v, want an error naming KURZ_REDIS_ADDRS without the password", err)
	}
}
