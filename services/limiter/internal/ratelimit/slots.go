package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/redisconn"
)

const slotCount = redisconn.SlotCount

// slotMap maps hash slots to master addresses, so the circuit breaker of a
// key's node is found without any I/O on the decision path (asking the
// client would reload cluster state over the network exactly when Redis is
// failing).
type slotMap struct {
	nodes atomic.Pointer[[slotCount]string]
}

// refresh reloads the map from CLUSTER SLOTS and returns the masters.
func (m *slotMap) refresh(ctx context.Context, rdb *redis.ClusterClient, timeout time.Duration) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	slots, err := rdb.ClusterSlots(ctx).Result()
	if err != nil {
		// The cluster client sends a command without a key to its masters
		// in turn, as it last knew them, and reloads that view every ten
		// seconds or so: after a failover its turn may fall on the dead
		// master at every refresh (it did, for 15 s, in TestRedisMasterKilled),
		// while the decisions of its slots fall back. Ask every master it
		// knows, take the first answer, and have it reload its view.
		rdb.ReloadState(ctx)
		if slots, err = slotsFromAnyMaster(ctx, rdb); err != nil {
			return nil, err
		}
	}
	var nodes [slotCount]string
	masters := map[string]bool{}
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			continue
		}
		masters[s.Nodes[0].Addr] = true
		for i := s.Start; i <= s.End && i < slotCount; i++ {
			nodes[i] = s.Nodes[0].Addr
		}
	}
	m.nodes.Store(&nodes)
	return masters, nil
}

// slotsFromAnyMaster is CLUSTER SLOTS as the first of the cluster client's
// masters to answer says it.
func slotsFromAnyMaster(ctx context.Context, rdb *redis.ClusterClient) ([]redis.ClusterSlot, error) {
	var (
		mu      sync.Mutex
		got     []redis.ClusterSlot
		lastErr error
	)
	_ = rdb.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		s, err := c.ClusterSlots(ctx).Result()
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			lastErr = err
		} else if got == nil {
			got = s
		}
		return nil
	})
	if got == nil {
		if lastErr == nil {
			lastErr = errors.New("no master known")
		}
		return nil, fmt.Errorf("cluster slots from every master: %w", lastErr)
	}
	return got, nil
}

// anyNode stands for the node of a key whose master the slot map does not
// know (not loaded yet, or a slot unassigned): one breaker covers those
// keys, and their calls go through the cluster client, which finds the node.
const anyNode = "cluster"

// node returns the master address serving key, or anyNode.
func (m *slotMap) node(key string) string {
	nodes := m.nodes.Load()
	if nodes == nil {
		return anyNode
	}
	if n := nodes[keySlot(key)]; n != "" {
		return n
	}
	return anyNode
}

// keySlot is Redis Cluster's hash slot of key.
func keySlot(key string) int { return redisconn.Slot(key) }
