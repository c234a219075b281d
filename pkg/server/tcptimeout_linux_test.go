package server

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The gRPC listener's guard keeps the TCP_USER_TIMEOUT gRPC itself sets
// only on the *net.TCPConn it accepts.
func TestGuardedGRPCConnectionsKeepTheUserTimeout(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gl := guardGRPCConns(lis, newConnGuard(16, 16, nil), 7*time.Second)
	defer gl.Close()
	client, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := gl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*guardedGRPCConn).Conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ms int
	var gerr error
	if err := raw.Control(func(fd uintptr) { ms, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT) }); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if ms != 7000 {
		t.Errorf("TCP_USER_TIMEOUT %d ms, want 7000", ms)
	}
}
