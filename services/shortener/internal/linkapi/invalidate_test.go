package linkapi_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	shortenerv1 "kurz.dev/gen/kurz/shortener/v1"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/services/shortener/internal/linkapi"
)

// shardedCache is the fake Redis as a cluster of two masters, one of them
// down: SETs of the keys it holds fail, and while all is set every SET
// fails. MasterForKey names each key's master (the clients are never
// used for commands).
type shardedCache struct {
	*cache
	live, dead *redis.Client
	mu         sync.Mutex
	all        bool
	onDead     map[string]bool
}

func newShardedCache(t *testing.T, c *cache) *shardedCache {
	s := &shardedCache{cache: c, onDead: map[string]bool{},
		live: redis.NewClient(&redis.Options{Addr: "live.test:6379"}),
		dead: redis.NewClient(&redis.Options{Addr: "dead.test:6379"})}
	t.Cleanup(func() { _ = s.live.Close(); _ = s.dead.Close() })
	return s
}

func (s *shardedCache) Set(ctx context.Context, key string, value any, ttl time.Duration) *redis.StatusCmd {
	s.mu.Lock()
	fail := s.all || s.onDead[key]
	s.mu.Unlock()
	if fail {
		return redis.NewStatusResult("", errors.New("dial tcp: connection refused"))
	}
	return s.cache.Set(ctx, key, value, ttl)
}

func (s *shardedCache) MasterForKey(_ context.Context, key string) (*redis.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.onDead[key] {
		return s.dead, nil
	}
	return s.live, nil
}

func (s *shardedCache) ForEachMaster(ctx context.Context, fn func(context.Context, *redis.Client) error) error {
	return errors.Join(fn(ctx, s.live), fn(ctx, s.dead))
}

// TestQueuedTakedownIsNotHeldBackByAMasterThatStaysDown: every takedown's
// write-through fails during a blip of the whole cluster, and afterwards
// one master stays down with a dozen of the queued codes, all older than
// a takedown on the healthy master. One pass of RunInvalidations refreshes
// the healthy master's link. Before, each pass stopped at its first
// failure, and one of the dead master's codes was always due and older, so
// the healthy link kept redirecting.
func TestQueuedTakedownIsNotHeldBackByAMasterThatStaysDown(t *testing.T) {
	var sc *shardedCache
	e := newEnvWith(t, func(d *linkapi.Deps) { sc = newShardedCache(t, d.Redis.(*cache)); d.Redis = sc },
		// The defaults (1 s, 10 s) scaled by 1/50.
		func(o *linkapi.Options) {
			o.RetryInterval = 20 * time.Millisecond
			o.RetryMaxDelay = 200 * time.Millisecond
		})
	ctx := as("acme")
	var codes []string
	for i := range 12 {
		l, err := e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/d", CustomAlias: fmt.Sprintf("dead-%02d", i)})
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, l.GetLink().GetCode())
	}
	healthy, err := e.client.CreateLink(ctx, &shortenerv1.CreateLinkRequest{LongUrl: "https://example.com/phish", CustomAlias: "healthy"})
	if err != nil {
		t.Fatal(err)
	}
	sc.mu.Lock()
	sc.all = true
	for _, c := range codes {
		sc.onDead[linkcache.Key(c)] = true
	}
	sc.mu.Unlock()
	for _, c := range append(codes, healthy.GetLink().GetCode()) {
		if _, err := e.client.UpdateLink(ctx, &shortenerv1.UpdateLinkRequest{Link: &shortenerv1.Link{Code: c, Disabled: true}, UpdateMask: mask("disabled")}); err != nil {
			t.Fatal(err)
		}
	}
	sc.mu.Lock()
	sc.all = false
	sc.mu.Unlock()

	// 4 s are 200 passes: 200 s at the defaults.
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.svc.RunInvalidations(rctx); close(done) }()
	deadline := time.Now().Add(4 * time.Second)
	for {
		if en, ok := e.cache.entry(t, healthy.GetLink().GetCode()); ok && en.State == linkcache.Gone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the takedown on the healthy master did not reach Redis in 200 passes while another master stayed down")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if n, _, err := e.store.PendingInvalidations(context.Background()); err != nil || n != int64(len(codes)) {
		t.Errorf("queued invalidations: %d (%v), want the dead master's %d", n, err, len(codes))
	}
}
