// Command limiter serves kurz.ratelimit.v1.RateLimitService: rate-limit
// decisions from Lua scripts on Redis Cluster.
//
// `limiter rules from-envoy FILE|DIR` prints the kurz rules an
// envoyproxy/ratelimit configuration translates to, and exits.
package main

import (
	"os"

	"kurz.dev/pkg/server"
	"kurz.dev/services/limiter/internal/app"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "rules" {
		os.Exit(app.RulesCommand(os.Args[2:], os.Stdout, os.Stderr))
	}
	server.Main("limiter", app.Build)
}
