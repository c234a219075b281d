package chconn_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/testkit/resptest"
)

func TestNewRejectsBadDatabaseName(t *testing.T) {
	_, err := chconn.New(context.Background(), chconn.Config{Addrs: []string{"127.0.0.1:9000"}, Database: "kurz; DROP"})
	if err == nil || !strings.Contains(err.Error(), "KURZ_CLICKHOUSE_DATABASE") {
		t.Fatalf("got %v, want an error naming KURZ_CLICKHOUSE_DATABASE", err)
	}
}

// An address that is a URL with credentials was dialled, and its password
// printed in the error ("clickhouse at clickhouse://kurz:pw@ch:9000
// unreachable ... too many colons in address").
func TestNewRefusesAnAddressThatIsNoHostPortWithoutEchoingIt(t *testing.T) {
	_, err := chconn.New(context.Background(), chconn.Config{Addrs: []string{"clickhouse://kurz:hunter2@127.0.0.1:9000"}, Database: "kurz"})
	if err == nil || !strings.Contains(err.Error(), "KURZ_CLICKHOUSE_ADDRS") || !strings.Contains(err.Error(), "host:port") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("got %v, want an error naming KURZ_CLICKHOUSE_ADDRS and host:port, without the password", err)
	}
}

// With KURZ_CLICKHOUSE_TLS the connection speaks TLS (the server's
// certificate verified against KURZ_CLICKHOUSE_TLS_CA_FILE): the password
// in the client's hello travels inside it.
func TestNewSpeaksTLS(t *testing.T) {
	ln, caFile := resptest.ListenTLS(t)
	hello := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 4096)
		n, _ := c.Read(b) // the TLS handshake first, then the hello
		hello <- b[:n]
	}()
	_, err := chconn.New(context.Background(), chconn.Config{Addrs: []string{ln.Addr().String()}, Database: "kurz",
		User: "default", Password: "chPwSECRET", DialTimeout: time.Second, TLS: true, TLSCAFile: caFile})
	if err == nil {
		t.Fatal("a server that never answers the hello: connected")
	}
	select {
	case b := <-hello:
		if !bytes.Contains(b, []byte("chPwSECRET")) {
			t.Errorf("the server read %q over TLS, want the client's hello with the password", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server read nothing")
	}
}

// A CA file named without TLS asked for is refused, not ignored (the
// password would go in clear).
func TestNewRefusesACAFileWithoutTLS(t *testing.T) {
	_, err := chconn.New(context.Background(), chconn.Config{Addrs: []string{"127.0.0.1:9000"}, Database: "kurz", TLSCAFile: "/ca.pem"})
	if err == nil || !strings.Contains(err.Error(), "KURZ_CLICKHOUSE_TLS_CA_FILE is set without KURZ_CLICKHOUSE_TLS=true") {
		t.Fatalf("got %v, want the CA file refused by name", err)
	}
}
