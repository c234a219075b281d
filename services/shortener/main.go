// Command shortener serves kurz.shortener.v1.ShortenerService: the write path
// of the URL shortener, links in PostgreSQL.
package main

import (
	"kurz.dev/pkg/server"
	"kurz.dev/services/shortener/internal/app"
)

func main() { server.Main("shortener", app.Build) }
