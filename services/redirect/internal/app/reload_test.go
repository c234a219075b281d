package app

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// A burst of change messages (any tenant can cause them) costs one read
// of the verified domains per gap, not one per message, and the last
// change is read: a trailing load follows the burst.
func TestDomainReloadsCoalesceABurstAndReadTheLastChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		const gap, messages = time.Second, 100
		var version, loaded, loads atomic.Int64
		load := func(context.Context) {
			loads.Add(1)
			loaded.Store(version.Load())
		}
		changes := make(chan any)
		done := make(chan struct{})
		go func() {
			defer close(done)
			reload(ctx, changes, time.Hour, gap, load)
		}()
		// 100 changes over 2 s, each published after it was committed
		// (the bubble's clock: sleeps advance it, synctest.Wait syncs).
		for range messages {
			version.Add(1)
			changes <- struct{}{}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(gap)
		synctest.Wait()
		if n := loads.Load(); n > int64(2*time.Second/gap)+2 {
			t.Errorf("%d messages over 2s caused %d loads, want at most one per %v", messages, n, gap)
		}
		if loaded.Load() != messages {
			t.Errorf("the last load read version %d, want the last change's %d", loaded.Load(), messages)
		}
		// A change after a quiet gap is read at once.
		version.Add(1)
		changes <- struct{}{}
		synctest.Wait()
		if loaded.Load() != messages+1 {
			t.Errorf("a change after a quiet period: loaded version %d, want %d at once", loaded.Load(), messages+1)
		}
		cancel()
		<-done
	})
}
