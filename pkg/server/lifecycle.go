package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Defaults of the shutdown bounds after the drain.
const (
	// DefaultCloseTimeout bounds the closes of all resources together.
	DefaultCloseTimeout = 10 * time.Second
	// lateClose is how long a close that starts after the budget is spent
	// is waited for: long enough for a client's Close that needs no
	// network, short enough that n of them cannot stretch a shutdown.
	lateClose = 100 * time.Millisecond
	// DefaultTelemetryFlushTimeout bounds the flush of buffered spans and
	// metrics, the very last step.
	DefaultTelemetryFlushTimeout = 5 * time.Second
)

// Lifecycle owns what a service opens while it starts (stores, connections
// to peers, background goroutines) and closes each of them exactly once: in
// reverse order of Own, when the start fails or after the server drained.
// The telemetry the server sets up is flushed after them all, within its
// own bound, so a slow drain or a slow close cannot cost the last spans.
//
// Build a service by owning each resource right after it opened; a failed
// step then returns its error and leaves the cleanup to the lifecycle.
type Lifecycle struct {
	log          *slog.Logger
	closeTimeout time.Duration

	mu     sync.Mutex
	owned  []resource
	closed bool
	// flush is the telemetry flush, run last within flushTimeout.
	flush        func(context.Context) error
	flushTimeout time.Duration
}

type resource struct {
	name  string
	close func(context.Context) error
}

// NewLifecycle returns an empty lifecycle whose closes take closeTimeout
// at most all together (DefaultCloseTimeout when not positive); failures
// are logged on log with the resource's name.
func NewLifecycle(log *slog.Logger, closeTimeout time.Duration) *Lifecycle {
	if closeTimeout <= 0 {
		closeTimeout = DefaultCloseTimeout
	}
	return &Lifecycle{log: log, closeTimeout: closeTimeout}
}

// Own hands the lifecycle a resource to close, under name in logs and
// errors. close gets a context that ends when the close budget is spent;
// past it the lifecycle stops waiting for it and goes on with the next
// resource. Own after Close closes the resource at once.
func (l *Lifecycle) Own(name string, close func(context.Context) error) {
	l.mu.Lock()
	closed := l.closed
	if !closed {
		l.owned = append(l.owned, resource{name: name, close: close})
	}
	l.mu.Unlock()
	if closed {
		_ = l.closeOne(context.Background(), resource{name: name, close: close})
	}
}

// OwnCloser is Own for a resource with a Close() error method: a Redis or
// ClickHouse client, a gRPC connection.
func (l *Lifecycle) OwnCloser(name string, c io.Closer) {
	l.Own(name, func(context.Context) error { return c.Close() })
}

// Go runs fn in a goroutine until the lifecycle closes it: its close cancels
// fn's context and waits for fn to return. Resources owned before Go close
// after fn returned, so fn may use them to the end.
func (l *Lifecycle) Go(name string, fn func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(ctx)
	}()
	l.Own(name, func(context.Context) error {
		cancel()
		<-done
		return nil
	})
}

// flushLast registers the telemetry flush, run after every resource closed,
// within timeout (DefaultTelemetryFlushTimeout when not positive).
func (l *Lifecycle) flushLast(flush func(context.Context) error, timeout time.Duration) {
	if timeout <= 0 {
		timeout = DefaultTelemetryFlushTimeout
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flush, l.flushTimeout = flush, timeout
}

// Close closes everything owned, last owned first, all within the close
// timeout (and ctx): a close that hangs spends the budget, and those after
// it still run but are waited for only briefly (lateClose). Then it flushes
// the telemetry within its own timeout, whatever is left of ctx. A shutdown
// after the drain therefore takes at most the close timeout, plus a moment
// per resource, plus the flush timeout. Each failure is logged with its
// resource's name; Close returns them joined. Only the first call closes
// anything.
func (l *Lifecycle) Close(ctx context.Context) error {
	l.mu.Lock()
	owned, flush := l.owned, l.flush
	l.owned, l.flush, l.closed = nil, nil, true
	l.mu.Unlock()

	budget, cancel := context.WithTimeout(ctx, l.closeTimeout)
	defer cancel()
	var errs []error
	for _, r := range slices.Backward(owned) {
		errs = append(errs, l.closeOne(budget, r))
	}
	if flush != nil {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.flushTimeout)
		errs = append(errs, l.report("telemetry", flush(fctx)))
		cancel()
	}
	return errors.Join(errs...)
}

// closeOne closes r within what is left of ctx (or lateClose, when that
// is nothing) and reports how it went.
func (l *Lifecycle) closeOne(ctx context.Context, r resource) error {
	done := make(chan error, 1)
	go func() { done <- r.close(ctx) }()
	wait := ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(context.WithoutCancel(ctx), lateClose)
		defer cancel()
	}
	select {
	case err := <-done:
		return l.report(r.name, err)
	case <-wait.Done():
		// Left running: a hung close must not hold the others (or the
		// process) hostage.
		return l.report(r.name, fmt.Errorf("not closed within the %s close budget: %w", l.closeTimeout, context.DeadlineExceeded))
	}
}

// report logs a failed close and names it in the returned error.
func (l *Lifecycle) report(name string, err error) error {
	if err == nil {
		return nil
	}
	l.log.Error("close failed", "resource", name, "err", err)
	return fmt.Errorf("close %s: %w", name, err)
}
