package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// DefaultGRPCMaxCalls is the most gRPC calls a server holds at once, over
// all its connections, when Config sets none (see GRPCMaxCallsFor). Every
// call holds a goroutine and its decoded headers (~12 KB with nothing sent
// yet) and may hold a request of up to the receive size while it arrives;
// MaxConcurrentStreams alone bounds one connection, not how many a caller
// opens. kurz's callers keep far fewer in flight: the limiter answers in
// about a millisecond, so even tens of thousands of decisions a second are
// a few hundred calls.
const DefaultGRPCMaxCalls = 1024

// GRPCRequestMemoryShare is the share of the Go memory limit (GOMEMLIMIT)
// that requests arriving may take when the bound on calls is derived
// (GRPCMaxCallsFor): a quarter, the rest for the heap the service itself
// needs.
const GRPCRequestMemoryShare = 0.25

// minDerivedGRPCMaxCalls is the fewest calls a derived bound allows.
const minDerivedGRPCMaxCalls = 4

// GRPCMaxCallsFor is the bound on calls of a server whose Config sets
// none: as many calls as fit GRPCRequestMemoryShare of memLimit (the Go
// runtime's, GOMEMLIMIT) each holding a request of recvSize as it arrives,
// at most DefaultGRPCMaxCalls and at least a few. gRPC grants a call's
// flow-control window up to the message it declares, so a caller can make
// the server hold every call's request at once: calls times the receive
// size must fit the process.
func GRPCMaxCallsFor(memLimit int64, recvSize int) int {
	if recvSize <= 0 {
		recvSize = DefaultGRPCMaxRecvMsgSize
	}
	n := int64(float64(memLimit)*GRPCRequestMemoryShare) / int64(recvSize)
	return int(min(max(n, minDerivedGRPCMaxCalls), DefaultGRPCMaxCalls))
}

// MetricGRPCCallsRefused counts the gRPC calls a server refused before
// serving them, by reason: "busy" when it already held its maximum
// (KURZ_GRPC_MAX_CALLS), "unauthenticated" when the call's headers carried
// no valid credentials (Config.GRPCAuthenticate), "too_large" when its
// request was larger than the receive bound (Config.GRPCMaxRecvMsgSize).
const MetricGRPCCallsRefused = "kurz.grpc.calls.refused"

// Reasons of MetricGRPCCallsRefused.
const (
	RefusedBusy            = "busy"
	RefusedUnauthenticated = "unauthenticated"
	RefusedTooLarge        = "too_large"
)

// callGate admits at most max gRPC calls at once. It runs as the server's
// tap, before a stream's goroutine starts or any of its message is read,
// so a refused call costs the server neither; an admitted call's slot
// returns when its stream ends (its context is cancelled then, however it
// ends). Refused calls fail with UNAVAILABLE, which callers retry (the
// gateway answers 503 with a Retry-After), as for any overloaded server:
// RESOURCE_EXHAUSTED without a kurz reason is, to the gateway, an answer
// it could not take (502). Before the count, authenticate (when set)
// checks the call's credentials: a stranger's call takes no place.
type callGate struct {
	max          int64
	n            atomic.Int64
	authenticate tap.ServerInHandle
	refused      metric.Int64Counter
	// The refusals' attributes, built once.
	busyAttr, unauthAttr, tooLargeAttr metric.AddOption
	busy                               error
	release                            func() // a place given back, bound once
}

func newCallGate(max int, authenticate tap.ServerInHandle, meter metric.Meter) (*callGate, error) {
	refused, err := meter.Int64Counter(MetricGRPCCallsRefused,
		metric.WithDescription("gRPC calls refused before they were served, by reason: busy (the server already held KURZ_GRPC_MAX_CALLS calls), unauthenticated, too_large (request over the receive bound)"),
		metric.WithUnit("{call}"))
	if err != nil {
		return nil, fmt.Errorf("gRPC call gate metrics: %w", err)
	}
	reason := func(r string) metric.AddOption {
		return metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", r)))
	}
	g := &callGate{
		max:          int64(max),
		authenticate: authenticate,
		refused:      refused,
		busyAttr:     reason(RefusedBusy),
		unauthAttr:   reason(RefusedUnauthenticated),
		tooLargeAttr: reason(RefusedTooLarge),
		busy:         status.Errorf(codes.Unavailable, "server busy: %d calls in flight, at most %d (KURZ_GRPC_MAX_CALLS)", max, max),
	}
	g.release = func() { g.n.Add(-1) }
	return g, nil
}

// slot is an admitted call's place at the gate: its stream's context, the
// place carried in it. The stream's end gives the place back:
// context.AfterFunc on the stream's context covers every way a stream
// ends, but costs a goroutine per call (~1.6 µs); so when the call reaches
// its handler (wrap), the gate stops that and gives the place back when
// the handler returns.
type slot struct {
	context.Context
	stop func() bool
}

type slotKey struct{}

// Value returns the slot itself for slotKey.
func (s *slot) Value(key any) any {
	if key == (slotKey{}) {
		return s
	}
	return s.Context.Value(key)
}

// healthCheck is the kubelet's readiness probe (grpc: in the manifests).
// It takes no place: a full server (a slow Redis keeps the limiter's calls
// open) would otherwise fail its probes, and with every replica full at
// once the Service would be left with none, turning busy into down. A
// check is answered from memory at once, so it cannot hold places the
// way a stream does; Health/Watch, which is a stream, takes one.
const healthCheck = "/grpc.health.v1.Health/Check"

// tap is the server's tap.ServerInHandle.
func (g *callGate) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if g.authenticate != nil {
		authed, err := g.authenticate(ctx, info)
		if err != nil {
			g.refused.Add(ctx, 1, g.unauthAttr)
			return nil, err
		}
		ctx = authed
	}
	if info.FullMethodName == healthCheck {
		return ctx, nil
	}
	if g.n.Add(1) > g.max {
		g.n.Add(-1)
		g.refused.Add(ctx, 1, g.busyAttr)
		return nil, g.busy
	}
	return &slot{Context: ctx, stop: context.AfterFunc(ctx, g.release)}, nil
}

// enter takes over the release of the place of the call ctx belongs to, if
// its stream has not ended yet; the caller then calls release.
func (g *callGate) enter(ctx context.Context) bool {
	sl, ok := ctx.Value(slotKey{}).(*slot)
	return ok && sl.stop()
}

// wrap returns desc with every handler releasing its call's place when it
// returns, and counting a request gRPC refused as too large (gRPC reports
// that only to the handler, as its request's reading error).
func (g *callGate) wrap(desc *grpc.ServiceDesc) *grpc.ServiceDesc {
	d := *desc
	d.Methods = slices.Clone(desc.Methods)
	for i, m := range d.Methods {
		handle := m.Handler
		d.Methods[i].Handler = func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			if g.enter(ctx) {
				defer g.release()
			}
			return handle(srv, ctx, func(v any) error { return g.read(ctx, dec(v)) }, ic)
		}
	}
	d.Streams = slices.Clone(desc.Streams)
	for i, st := range d.Streams {
		handle := st.Handler
		d.Streams[i].Handler = func(srv any, ss grpc.ServerStream) error {
			if g.enter(ss.Context()) {
				defer g.release()
			}
			return handle(srv, &gatedStream{ServerStream: ss, g: g})
		}
	}
	return &d
}

// read counts err, a request's reading error, if gRPC refused the request
// as too large, and returns it.
func (g *callGate) read(ctx context.Context, err error) error {
	if err != nil && tooLarge(err) {
		g.refused.Add(ctx, 1, g.tooLargeAttr)
	}
	return err
}

// gatedStream counts its requests refused as too large.
type gatedStream struct {
	grpc.ServerStream
	g *callGate
}

func (s *gatedStream) RecvMsg(m any) error { return s.g.read(s.Context(), s.ServerStream.RecvMsg(m)) }

// tooLarge reports whether err is gRPC's refusal of a request over the
// receive bound (sent or decompressed). gRPC reports it only as the
// request's reading error, and its status is RESOURCE_EXHAUSTED like a
// handler's own, so its message tells it apart.
func tooLarge(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.ResourceExhausted && strings.HasPrefix(st.Message(), "grpc: received message ") &&
		strings.Contains(st.Message(), "larger than max")
}
