// Command analytics moves click events from Redis streams into ClickHouse and
// serves kurz.analytics.v1.AnalyticsService.
package main

import (
	"kurz.dev/pkg/server"
	"kurz.dev/services/analytics/internal/app"
)

func main() { server.Main("analytics", app.Build) }
