package app

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// shard is a CLUSTER SHARDS entry: a master on port with slots (or none)
// and one replica per health given.
func shard(port int64, slots bool, replicas ...string) redis.ClusterShard {
	s := redis.ClusterShard{Nodes: []redis.Node{{Endpoint: "10.0.0.1", Port: port, Role: "master", Health: "online"}}}
	if slots {
		s.Slots = []redis.SlotRange{{Start: 0, End: 100}}
	}
	for _, h := range replicas {
		s.Nodes = append(s.Nodes, redis.Node{Endpoint: "10.0.0.2", Port: port, Role: "replica", Health: h})
	}
	return s
}

// KURZ_REDIRECT_VISIT_REPLICAS above the online replicas of a master that
// holds slots is reported naming the variable and that master; replicas
// that are down do not count, and a master without slots holds no counter.
func TestVisitReplicasComparedWithEachMastersOnlineReplicas(t *testing.T) {
	shards := []redis.ClusterShard{
		shard(7001, true, "online", "online"),
		shard(7002, true, "online", "failed"),
		shard(7003, false),
	}
	if err := replicasShort(shards, 1); err != nil {
		t.Errorf("KURZ_REDIRECT_VISIT_REPLICAS=1: %v, want nil (every master with slots has a replica online)", err)
	}
	err := replicasShort(shards, 2)
	if err == nil || !strings.Contains(err.Error(), "KURZ_REDIRECT_VISIT_REPLICAS=2") || !strings.Contains(err.Error(), "10.0.0.1:7002 has 1") {
		t.Errorf("KURZ_REDIRECT_VISIT_REPLICAS=2: %v, want an error naming it and 10.0.0.1:7002 with 1 replica online", err)
	}
	if err != nil && (strings.Contains(err.Error(), ":7001") || strings.Contains(err.Error(), ":7003")) {
		t.Errorf("KURZ_REDIRECT_VISIT_REPLICAS=2: %v names a master that has enough replicas or no slots", err)
	}
}
