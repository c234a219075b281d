// Package logging builds the structured logger every kurz service uses.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Config selects the log level and format.
type Config struct {
	// Level is the lowest level logged: debug, info, warn or error.
	Level string `env:"LOG_LEVEL" default:"info"`
	// Format is the log format: json or text (slog).
	Format string `env:"LOG_FORMAT" default:"json"`
}

// New returns a logger writing to w in the configured format, tagged with the
// service name so lines from several services can share one stream.
func New(w io.Writer, cfg Config, service string) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.Level)); err != nil {
		return nil, fmt.Errorf("KURZ_LOG_LEVEL=%q: want debug, info, warn or error", cfg.Level)
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch strings.ToLower(cfg.Format) {
	case "json":
		h = slog.NewJSONHandler(w, opts)
	case "text":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("KURZ_LOG_FORMAT=%q: want json or text", cfg.Format)
	}
	return slog.New(h).With("service", service), nil
}
