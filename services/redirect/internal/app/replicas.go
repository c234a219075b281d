package app

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/redisconn"
)

// visitReplicasHeld reports the masters of rdb that have fewer replicas
// online than KURZ_REDIRECT_VISIT_REPLICAS asks WAIT for. A visit counted
// on such a master is refused (503), yet its INCR stands: every visit of
// a visit-limited link whose key lives there is refused and spends one.
// Nothing else shows it (the pod is ready, the redirects of other links
// work), so the redirect warns at start and reports it in readiness.
func visitReplicasHeld(ctx context.Context, rdb *redis.ClusterClient, want int) error {
	short, err := redisconn.ShortOfReplicas(ctx, rdb, want)
	if err != nil {
		return fmt.Errorf("KURZ_REDIRECT_VISIT_REPLICAS=%d not compared with the cluster's replicas: %w", want, err)
	}
	if len(short) == 0 {
		return nil
	}
	return fmt.Errorf("KURZ_REDIRECT_VISIT_REPLICAS=%d is more than the replicas online (%s): visits of visit-limited links counted there are refused (503) and still spent; lower it or add replicas",
		want, strings.Join(short, ", "))
}
