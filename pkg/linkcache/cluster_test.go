//go:build integration

package linkcache

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"kurz.dev/pkg/redisconn"
)

// TestFillNeverOverwritesWriteThrough runs against the local Redis Cluster.
func TestFillNeverOverwritesWriteThrough(t *testing.T) {
	ctx := context.Background()
	rdb, err := redisconn.New(ctx, redisconn.Config{
		Addrs:       []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"},
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, PoolSize: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	code := "lcT" + rand.Text()[:10]
	t.Cleanup(func() { rdb.Del(context.Background(), Key(code)) })

	sub := rdb.Subscribe(ctx, InvalidationChannel)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription confirmation
		t.Fatal(err)
	}

	if err := Fill(ctx, rdb, code, Entry{State: Missing}, time.Minute); err != nil {
		t.Fatal(err)
	}
	active := Entry{State: Active, URL: "https://example.com/", Tenant: "t"}
	if err := WriteThrough(ctx, rdb, code, active, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := Fill(ctx, rdb, code, Entry{State: Missing}, time.Minute); err != nil {
		t.Fatal(err)
	}
	got, found, err := Get(ctx, rdb, code)
	if err != nil || !found || got != active {
		t.Fatalf("after write-through then a stale fill: got %+v found=%v err=%v, want %+v", got, found, err, active)
	}
	if ttl := rdb.TTL(ctx, Key(code)).Val(); ttl <= time.Minute {
		t.Errorf("TTL %v: want the write-through's hour, not the negative minute", ttl)
	}
	msgCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		msg, err := sub.ReceiveMessage(msgCtx)
		if err != nil {
			t.Fatalf("no invalidation for %s: %v", code, err)
		}
		if msg.Payload == code {
			break
		}
	}
}
