// Command limiter serves kurz.ratelimit.v1.RateLimitService: rate-limit
// decisions from Lua scripts on Redis Cluster.
package main

import (
	"kurz.dev/pkg/server"
	"kurz.dev/services/limiter/internal/app"
)

func main() { server.Main("limiter", app.Build) }
