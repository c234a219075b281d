// Command gateway serves kurz's public JSON API over HTTP.
package main

import (
	"kurz.dev/pkg/server"
	"kurz.dev/services/gateway/internal/app"
)

func main() { server.Main("gateway", app.Build) }
