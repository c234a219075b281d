package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"kurz.dev/pkg/buildinfo"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/logging"
)

// Build wires a service from its configuration and returns its server, ready
// to Run. It connects to every dependency first, so a missing one fails the
// start with a message that names it, and hands each resource it opens to lc
// as soon as it is open: lc closes them if Build fails, or after the server
// drained.
type Build[C any] func(ctx context.Context, cfg C, lc *Lifecycle, log *slog.Logger) (*Server, error)

// Service is what Main and Start need of a service's configuration: the
// settings every service shares. Embedding Common is the way to have them.
type Service interface{ common() Common }

// Main is the whole of a service's main: it loads C and the logging settings
// from the environment, builds the service, and runs it until SIGINT or
// SIGTERM. It exits the process once, with status 1 on any error.
func Main[C Service](name string, build Build[C]) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, name, build)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

func run[C Service](ctx context.Context, name string, build Build[C]) error {
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
	bi := buildinfo.Get()
	log.Info("starting", "version", bi.Version, "commit", bi.ShortCommit(), "built", bi.Date, "go", bi.Go)
	srv, err := Start(ctx, cfg, log, build)
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}

// Start builds a service within a new lifecycle, as Main does before Run; if
// build fails, what it owned by then is closed, last first. Tests use it to
// start a service in process.
func Start[C Service](ctx context.Context, cfg C, log *slog.Logger, build Build[C]) (*Server, error) {
	lc := NewLifecycle(log, cfg.common().CloseTimeout)
	srv, err := build(ctx, cfg, lc, log)
	if err != nil {
		// A start cut short by SIGTERM still closes what it opened.
		return nil, errors.Join(err, lc.Close(context.WithoutCancel(ctx)))
	}
	return srv, nil
}
