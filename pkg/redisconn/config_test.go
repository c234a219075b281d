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
