package loadgen

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/redisconn"
)

// toolDeadline is the least read and write deadline of a load tool's
// Redis client. The services' defaults (100 ms) suit a decision on the hot
// path, not a pipeline seeding thousands of entries on a node the last
// measurement left busy: one slow reply would end a whole `make bench`.
const toolDeadline = 5 * time.Second

// Redis connects to the stack's Redis Cluster as its services do (the
// KURZ_REDIS_* variables), with deadlines of at least toolDeadline.
func Redis(ctx context.Context) (*redis.ClusterClient, error) {
	var rc redisconn.Config
	if err := config.Load(&rc); err != nil {
		return nil, err
	}
	rc.ReadTimeout = max(rc.ReadTimeout, toolDeadline)
	rc.WriteTimeout = max(rc.WriteTimeout, toolDeadline)
	return redisconn.New(ctx, rc)
}
