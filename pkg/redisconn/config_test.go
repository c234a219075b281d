package redisconn_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/redisconn"
)

func TestNewNamesTheVariableWhenUnreachable(t *testing.T) {
	_, err := redisconn.New(context.Background(), redisconn.Config{
		Addrs: []string{"127.0.0.1:1"}, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond,
	})
	if err == nil || !strings.Contains(err.Error(), "KURZ_REDIS_ADDRS") {
		t.Fatalf("got %v, want an error naming KURZ_REDIS_ADDRS", err)
	}
}
