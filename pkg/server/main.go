package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
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

// Checker is a service's Config that checks its own settings: Main runs
// Check beside the logging and shared checks, before anything starts, so
// every refused setting is named at once.
type Checker interface{ Check() error }

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
	read := map[string]bool{}
	lookup := func(name string) (string, bool) {
		read[name] = true
		return os.LookupEnv(name)
	}
	if err := config.LoadFrom(lookup, &logCfg); err != nil {
		return fmt.Errorf("configuration:\n%w", err)
	}
	if err := config.LoadFrom(lookup, &cfg); err != nil {
		return fmt.Errorf("configuration:\n%w", err)
	}
	errs := []error{logCfg.Check(), cfg.common().check()}
	if c, ok := any(cfg).(Checker); ok {
		errs = append(errs, c.Check())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("configuration:\n%w", err)
	}
	var out io.Writer = os.Stderr
	if logCfg.FlushInterval > 0 {
		bw := logging.NewBuffered(os.Stderr, logCfg.FlushInterval)
		defer bw.Close()
		out = bw
	}
	log, err := logging.New(out, logCfg, name)
	if err != nil {
		return err
	}
	// Libraries that log through slog's default (go-redis, by way of
	// pkg/redisconn) write the service's lines.
	slog.SetDefault(log)
	gogc := os.Getenv("GOGC")
	if p, ok := gcPercent(os.Getenv); ok {
		debug.SetGCPercent(p)
		gogc = strconv.Itoa(p)
	}
	// A typo in a variable's name would leave its default in force
	// without a word.
	for _, u := range config.Unread(os.Environ(), read, name) {
		log.Warn("unknown variable ignored", "variable", u.Name, "did_you_mean", u.Near)
	}
	bi := buildinfo.Get()
	log.Info("starting", "version", bi.Version, "commit", bi.ShortCommit(), "built", bi.Date, "go", bi.Go,
		"gogc", cmp.Or(gogc, "100"), "gomemlimit", os.Getenv("GOMEMLIMIT"))
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

// DefaultGCPercent is the GOGC a service runs with when the environment sets
// GOMEMLIMIT and no GOGC. A service's live heap is small (the limiter's a few
// MiB), so Go's default of 100 collected every few MiB allocated: 18 times a
// second for the limiter under load, each collection shrinking the stacks of
// idle goroutines that the next calls grew again. The memory limit bounds
// the heap that a rarer collection lets grow.
const DefaultGCPercent = 400

// gcPercent is the GOGC to set at start: DefaultGCPercent when getenv has a
// GOMEMLIMIT and no GOGC; ok is false when Go's own setting stands (GOGC set,
// or no memory limit to bound a larger heap).
func gcPercent(getenv func(string) string) (percent int, ok bool) {
	if getenv("GOGC") != "" || getenv("GOMEMLIMIT") == "" {
		return 0, false
	}
	return DefaultGCPercent, true
}
