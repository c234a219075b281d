package app

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// visitReplicasHeld reports the masters of rdb that have fewer replicas
// online than KURZ_REDIRECT_VISIT_REPLICAS asks WAIT for. A visit counted
// on such a master is refused (503), yet its INCR stands: every visit of
// a visit-limited link whose key lives there is refused and spends one.
// Nothing else shows it (the pod is ready, the redirects of other links
// work), so the redirect warns at start and reports it in readiness.
func visitReplicasHeld(ctx context.Context, rdb *redis.ClusterClient, want int) error {
	shards, err := rdb.ClusterShards(ctx).Result()
	if err != nil {
		return fmt.Errorf("KURZ_REDIRECT_VISIT_REPLICAS=%d not compared with the cluster's replicas: cluster shards: %w", want, err)
	}
	return replicasShort(shards, want)
}

// replicasShort is visitReplicasHeld on the answer of CLUSTER SHARDS; a
// shard without slots holds no counter and is left out.
func replicasShort(shards []redis.ClusterShard, want int) error {
	var short []string
	for _, s := range shards {
		if len(s.Slots) == 0 {
			continue
		}
		master, online := "a master", 0
		for _, n := range s.Nodes {
			switch n.Role {
			case "master":
				master = net.JoinHostPort(cmp.Or(n.Endpoint, n.IP), strconv.FormatInt(cmp.Or(n.Port, n.TLSPort), 10))
			case "replica":
				if n.Health == "online" {
					online++
				}
			}
		}
		if online < want {
			short = append(short, fmt.Sprintf("%s has %d", master, online))
		}
	}
	if len(short) == 0 {
		return nil
	}
	return fmt.Errorf("KURZ_REDIRECT_VISIT_REPLICAS=%d is more than the replicas online (%s): visits of visit-limited links counted there are refused (503) and still spent; lower it or add replicas",
		want, strings.Join(short, ", "))
}
