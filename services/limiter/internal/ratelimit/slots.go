package ratelimit

import (
	"context"
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
		return nil, err
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
