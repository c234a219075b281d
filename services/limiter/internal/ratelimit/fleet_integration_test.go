//go:build integration

package ratelimit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric/noop"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/pkg/testkit/servertest"
)

const fleetRules = `
domains:
  f:
    rules:
      - {name: local, key: [user], algorithm: token_bucket, limit: 1200, window: 24h, failure_mode: local}
`

// replica is one limiter of a test fleet: an engine whose decisions go to
// a Redis nothing listens on (so every one falls back to the rule's local
// bucket), heartbeating into the real cluster's fleet key.
type replica struct {
	e     *Engine
	fleet *Fleet
	stop  context.CancelFunc
	done  chan struct{}
	probe atomic.Int64
}

// deadCluster is a cluster client of an address nothing listens on.
func deadCluster(t *testing.T) *redis.ClusterClient {
	addr, err := servertest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// startReplica joins a replica to the fleet name on the real cluster.
// crashable replicas heartbeat without Run, so stopping them leaves their
// entry behind, as a killed pod does.
func startReplica(t *testing.T, name string, crashable bool) *replica {
	t.Helper()
	f, err := NewFleet(cluster(t), FleetOptions{Name: name, Heartbeat: 100 * time.Millisecond, MaxReplicas: 12}, quiet, noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{fleet: f, done: make(chan struct{})}
	r.e = engine(t, deadCluster(t), fleetRules, Options{Timeout: 200 * time.Millisecond, Fleet: f, BreakerCooldown: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = func() { cancel(); <-r.done }
	go func() {
		defer close(r.done)
		if !crashable {
			f.Run(ctx)
			return
		}
		tick := time.NewTicker(f.every)
		defer tick.Stop()
		for ctx.Err() == nil {
			f.beatOnce(ctx)
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

// share is the local bucket size a fresh key gets on r right now, from a
// fallback decision.
func (r *replica) share(t *testing.T) int64 {
	key := fmt.Sprintf("probe-%d", r.probe.Add(1))
	resp := r.e.Check(context.Background(), "f", map[string]string{"user": key}, 1)
	if resp.Source != ratelimitv1.DecisionSource_DECISION_SOURCE_LOCAL_FALLBACK {
		t.Fatalf("source %v, want LOCAL_FALLBACK (decisions go to a dead Redis)", resp.Source)
	}
	return resp.Limit
}

// awaitShares waits until every replica's fallback holds want per key.
func awaitShares(t *testing.T, what string, want int64, rs ...*replica) {
	t.Helper()
	ok, state := servertest.EventuallyState(10*time.Second, func() (bool, string) {
		var got []string
		all := true
		for _, r := range rs {
			s := r.share(t)
			all = all && s == want
			got = append(got, fmt.Sprintf("%d (fleet size %d)", s, r.fleet.Size()))
		}
		return all, strings.Join(got, ", ")
	})
	if !ok {
		t.Fatalf("%s: local shares %s, want %d each", what, state, want)
	}
}

// The local fallback's share follows the fleet: 1 replica holds the whole
// limit, 3 a third each, and back as replicas leave (one shutting down,
// one killed, whose entry expires).
func TestLocalFallbackFollowsReplicasUpAndDown(t *testing.T) {
	name := unique(t)
	a := startReplica(t, name, false)
	awaitShares(t, "one replica", 1200, a)

	b := startReplica(t, name, false)
	c := startReplica(t, name, true)
	awaitShares(t, "three replicas", 400, a, b, c)

	// What the fleet admits in fallback: each replica 400 of a fresh key,
	// 1,200 in all, the rule's limit (the day-long window refills nothing
	// meanwhile).
	var wg sync.WaitGroup
	var allowed atomic.Int64
	user := unique(t)
	for _, r := range []*replica{a, b, c} {
		wg.Go(func() {
			for range 1000 {
				if r.e.Check(context.Background(), "f", map[string]string{"user": user}, 1).Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := allowed.Load(); got != 1200 {
		t.Errorf("three replicas in fallback, 3,000 calls on one key: %d allowed, want the limit, 1200", got)
	}

	b.stop() // leaves the fleet on the way out
	awaitShares(t, "b shut down", 600, a, c)

	c.stop() // killed: counted until its entry expires (3 heartbeats)
	awaitShares(t, "c killed", 1200, a)
}

// A replica that has never read the fleet (its Redis down from the start)
// holds the configured maximum's share.
func TestFleetWithoutRedisAssumesTheMaximum(t *testing.T) {
	f, err := NewFleet(deadCluster(t), FleetOptions{Name: unique(t), Heartbeat: 100 * time.Millisecond, MaxReplicas: 12}, quiet, noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	e := engine(t, deadCluster(t), fleetRules, Options{Timeout: 200 * time.Millisecond, Fleet: f, BreakerCooldown: time.Hour})
	f.beatOnce(context.Background())
	if f.Size() != 12 || f.Known() {
		t.Errorf("Redis down from the start: size %d known %v, want 12 (the maximum), unknown", f.Size(), f.Known())
	}
	r := &replica{e: e, fleet: f}
	if got := r.share(t); got != 100 {
		t.Errorf("Redis down from the start: share %d, want 100 (1200/12)", got)
	}
}
