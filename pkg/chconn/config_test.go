package chconn_test

import (
	"context"
	"strings"
	"testing"

	"kurz.dev/pkg/chconn"
)

func TestNewRejectsBadDatabaseName(t *testing.T) {
	_, err := chconn.New(context.Background(), chconn.Config{Addrs: []string{"127.0.0.1:9000"}, Database: "kurz; DROP"})
	if err == nil || !strings.Contains(err.Error(), "KURZ_CLICKHOUSE_DATABASE") {
		t.Fatalf("got %v, want an error naming KURZ_CLICKHOUSE_DATABASE", err)
	}
}
