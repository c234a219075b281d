//go:build !linux

package server

import (
	"net"
	"time"
)

// setUserTimeout does nothing where TCP_USER_TIMEOUT does not exist, as
// gRPC does nothing there.
func setUserTimeout(net.Conn, time.Duration) error { return nil }
