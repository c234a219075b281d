package server

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// setUserTimeout sets c's TCP_USER_TIMEOUT, as gRPC sets it on the
// connections it accepts when keepalive is on: data unacknowledged that
// long ends the connection. gRPC sets it only on a *net.TCPConn, which a
// guarded listener's connections are not.
func setUserTimeout(c net.Conn, d time.Duration) error {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d/time.Millisecond))
	}); err != nil {
		return err
	}
	return serr
}
