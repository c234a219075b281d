//go:build integration

package linkapi_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/testkit/redistest"
	"kurz.dev/services/shortener/internal/linkapi"
)

// TestTakedownStaysQueuedUntilAReplicaHoldsIt: a link is disabled while
// its Redis master's replica is frozen. The master takes the write-through,
// but no replica acknowledges it, so the change stays queued (a failover
// to that replica would bring the active entry back for its whole TTL);
// once the replica is back, the retry leaves the replica itself holding
// the gone entry and nothing queued. Before, the master's acknowledgement
// alone ended the invalidation.
func TestTakedownStaysQueuedUntilAReplicaHoldsIt(t *testing.T) {
	master := redistest.Start(t)
	replica := master.StartReplica()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{master.Addr},
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	e := newEnvWith(t, func(d *linkapi.Deps) { d.Redis = rdb }, func(o *linkapi.Options) {
		// Long enough for a loaded machine's replica to acknowledge,
		// short enough for the frozen replica's refusal.
		o.CacheTimeout = 1500 * time.Millisecond
		o.CacheReplicas = 1
		o.RetryInterval = 20 * time.Millisecond
		o.RetryMaxDelay = 100 * time.Millisecond
	})
	ctx := as("acme")
	made, err := e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/phish"})
	if err != nil {
		t.Fatal(err)
	}
	code := made.GetLink().GetCode()

	replica.Pause()
	if _, err := e.client.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{
		Link: &shortenerv1.Link{Code: code, Disabled: true}, UpdateMask: mask("disabled")}); err != nil {
		t.Fatalf("UpdateLink (disable) with the replica frozen: %v, want success (the change is committed)", err)
	}
	if n, _, err := e.store.PendingInvalidations(context.Background()); err != nil || n != 1 {
		t.Errorf("queued invalidations after a takedown no replica acknowledged: %d (%v), want 1", n, err)
	}
	replica.Resume()

	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.svc.RunInvalidations(rctx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, _, err := e.store.PendingInvalidations(context.Background())
		if err == nil && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queued invalidations 10 s after the replica came back: %d (%v), want 0", n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The replica answers reads (READONLY) on one connection.
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr, PoolSize: 1})
	t.Cleanup(func() { _ = rc.Close() })
	if err := rc.Do(context.Background(), "READONLY").Err(); err != nil {
		t.Fatal(err)
	}
	got, found, err := linkcache.Get(context.Background(), rc, code)
	if err != nil || !found || got.State != linkcache.Gone {
		t.Errorf("replica's entry once nothing is queued: %+v found=%v (%v), want state gone", got, found, err)
	}
}
