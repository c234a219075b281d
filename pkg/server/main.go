package server

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/logging"
)

// Build wires a service from its configuration and returns its server, ready
// to Run. It connects to every dependency first, so a missing one fails the
// start with a message that names it.
type Build[C any] func(ctx context.Context, cfg C, log *slog.Logger) (*Server, error)

// Main is the whole of a service's main: it loads C and the logging settings
// from the environment, builds the service, and runs it until SIGINT or
// SIGTERM. It exits the process once, with status 1 on any error.
func Main[C any](name string, build Build[C]) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, name, build)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

func run[C any](ctx context.Context, name string, build Build[C]) error {
	var logCfg logging.Config
	var cfg C
	if err := config.Load(&logCfg); err != nil {
		return fmt.Errorf("configuration:\n%w", err)
	}
	if err := config.Load(&cfg); err != nil {
		return fmt.Errorf("configuration:\n%w", err)
	}
	log, err := logging.New(os.Stderr, logCfg, name)
	if err != nil {
		return err
	}
	srv, err := build(ctx, cfg, log)
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}
