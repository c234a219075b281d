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
	for _, bad := range []string{"127.0.0.1", "redis-0", ":6379", "h:", "h:0", "h:65536", "h:http", "h:-1", "::1", "a b:1", "pw@h:6379", "h/x:1"} {
		err := config.HostPort(bad)
		if err == nil || !strings.Contains(err.Error(), "host:port") {
			t.Errorf("HostPort(%q) = %v, want an error saying host:port", bad, err)
		}
	}
}

// A URL with credentials in an address variable (redis://:pw@host:6379,
// a REDIS_URL habit) put the password in every dial error the service
// logged. HostPort refuses it without repeating the credentials.
func TestHostPortHidesCredentials(t *testing.T) {
	for _, addr := range []string{"redis://:hunter2@10.0.0.1:6379", "clickhouse://kurz:hunter2@ch:9000", "hunter2@10.0.0.1:6379", "kurz:hunter2@ch:9000"} {
		err := config.HostPort(addr)
		if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "host:port") {
			t.Errorf("HostPort(%q) = %v, want an error saying host:port without the password", addr, err)
		}
	}
	if got := config.Redacted("redis://:hunter2@10.0.0.1:6379"); strings.Contains(got, "hunter2") || !strings.Contains(got, "10.0.0.1:6379") {
		t.Errorf("Redacted = %q, want the host without the password", got)
	}
}

// A DSN with its credentials in the query (clickhouse-go's
// clickhouse://ch:9000?username=kurz&password=..., a token a vendor's
// OTLP endpoint takes as a parameter) is refused as host:port, and its
// error, logged at start, repeated the password: Redacted hid only what
// came before an "@".
func TestHostPortHidesCredentialsInTheQuery(t *testing.T) {
	for _, addr := range []string{"clickhouse://ch:9000?username=kurz&password=hunter2", "tcp://ch:9000?password=hunter2", "ch:9000?password=hunter2", "https://otel.example:4317/?api_key=hunter2", "redis://10.0.0.1:6379#hunter2"} {
		err := config.HostPort(addr)
		if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "host:port") {
			t.Errorf("HostPort(%q) = %v, want an error saying host:port without the password", addr, err)
		}
	}
	if got := config.Redacted("clickhouse://kurz:pw@ch:9000?password=hunter2"); strings.Contains(got, "hunter2") || strings.Contains(got, "pw") || !strings.Contains(got, "ch:9000") {
		t.Errorf("Redacted = %q, want the host without the credentials", got)
	}
}
