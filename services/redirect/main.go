// Command redirect serves short codes over HTTP: the read path of the URL
// shortener.
package main

import (
	"kurz.dev/pkg/server"
	"kurz.dev/services/redirect/internal/app"
)

func main() { server.Main("redirect", app.Build) }
