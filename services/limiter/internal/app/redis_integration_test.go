//go:build integration

package app

import (
	"context"
	"testing"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/testkit/servertest"
)

// The limiter's Redis client never resends a command that may have run
// (redisconn.NoRetries): a refund or a lease's give-back resent after a
// lost reply hands back used units (ratelimit's
// TestALostRefundReplyIsNotSentAgain shows an 11th request of 10 admitted).
func TestRedisClientNeverResends(t *testing.T) {
	var cfg redisconn.Config
	if err := config.Load(&cfg); err != nil {
		t.Fatal(err)
	}
	rdb, err := newRedis(context.Background(), cfg, servertest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if n := rdb.Options().MaxRetries; n != -1 {
		t.Errorf("the limiter's Redis client resends up to %d times, want never (-1)", n)
	}
}
