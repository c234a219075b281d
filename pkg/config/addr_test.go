package config_test

import (
	"strings"
	"testing"

	"kurz.dev/pkg/config"
)

func TestHostPort(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:7001", "redis-0.redis-headless:6379", "[::1]:9091", "localhost:1", "h:65535"} {
		if err := config.HostPort(ok); err != nil {
			t.Errorf("HostPort(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"127.0.0.1", "redis-0", ":6379", "h:", "h:0", "h:65536", "h:http", "h:-1", "::1", "a b:1"} {
		err := config.HostPort(bad)
		if err == nil || !strings.Contains(err.Error(), "host:port") {
			t.Errorf("HostPort(%q) = %v, want an error saying host:port", bad, err)
		}
	}
}
