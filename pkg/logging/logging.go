// Package logging builds the structured logger every kurz service uses.
package logging

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"kurz.dev/pkg/config"
)

// Config selects the log level and format.
type Config struct {
	// Level is the lowest level logged: debug, info, warn or error.
	Level string `env:"LOG_LEVEL" default:"info"`
	// Format is the log format: json or text (slog).
	Format string `env:"LOG_FORMAT" default:"json"`
	// FlushInterval is how long a service's log lines may wait in memory
	// to be written together (also once 64 KiB wait, and at exit); a crash
	// loses at most this much. 0 writes every line at once; else at least
	// 10ms (the flush runs on a ticker).
	FlushInterval time.Duration `env:"LOG_FLUSH_INTERVAL" default:"100ms"`
}

// Check reports every setting of cfg that New would refuse, at once.
func (cfg Config) Check() error {
	var errs []error
	if err := new(slog.Level).UnmarshalText([]byte(cfg.Level)); err != nil {
		errs = append(errs, fmt.Errorf("KURZ_LOG_LEVEL=%q: want debug, info, warn or error", cfg.Level))
	}
	if f := strings.ToLower(cfg.Format); f != "json" && f != "text" {
		errs = append(errs, fmt.Errorf("KURZ_LOG_FORMAT=%q: want json or text", cfg.Format))
	}
	errs = append(errs, config.PeriodOrOff("KURZ_LOG_FLUSH_INTERVAL", cfg.FlushInterval, 10*time.Millisecond))
	return errors.Join(errs...)
}

// New returns a logger writing to w in the configured format, tagged with the
// service name so lines from several services can share one stream.
func New(w io.Writer, cfg Config, service string) (*slog.Logger, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Level)) // checked
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewJSONHandler(w, opts)
	if strings.ToLower(cfg.Format) == "text" {
		h = slog.NewTextHandler(w, opts)
	}
	return slog.New(traceHandler{h}).With("service", service), nil
}

// traceHandler adds the trace_id and span_id of the span in a record's
// context (the *Context logging calls pass it), so a log line inside a
// traced request leads to its trace.
type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(attrs)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}
