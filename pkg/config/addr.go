package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// HostPort refuses addr unless it is host:port with a host and a port from
// 1 to 65535, as every address a service dials must be: clients fill a
// missing port in differently (gRPC's DNS resolver dials 443, go-redis
// fails each dial), so a forgotten port showed only later, as an outage.
// The error quotes addr; the caller names the variable.
func HostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || strings.ContainsAny(host, " \t") {
		return fmt.Errorf("%q: want host:port", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: want host:port, the port from 1 to 65535", addr)
	}
	return nil
}
