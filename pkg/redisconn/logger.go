package redisconn

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/logging"
)

// installLogger sends go-redis's own messages (a pool that cannot dial, a
// cluster topology that cannot be reloaded) to slog's default logger (the
// service's, set by pkg/server) as warnings, at most one a second with the
// number left out since the last, instead of go-redis's plain-text lines on
// stderr among the service's JSON lines. go-redis has one logger per
// process: New installs it once.
var installLogger = sync.OnceFunc(func() {
	redis.SetLogger(&goRedisLog{})
})

type goRedisLog struct {
	log   *slog.Logger // nil: slog.Default()
	every logging.Every
}

func (l *goRedisLog) Printf(ctx context.Context, format string, v ...any) {
	dropped, ok := l.every.Allow()
	if !ok {
		return
	}
	log := l.log
	if log == nil {
		log = slog.Default()
	}
	log.WarnContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis", "left_out_since_last", dropped)
}
