package telemetry

import (
	"context"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// GRPCServer instruments a gRPC server: Wrap times every call of a service
// (the rpc.server.call.duration histogram, health checks aside) and carries
// the caller's trace into its handler; StatsHandler records a server span
// per call, when traces are exported.
//
// The calls are timed by wrapping each service's handlers, not by a stats
// handler: a gRPC server with any stats handler copies every call's
// metadata for it and reports seven events a call (~9% of the limiter's
// CPU per decision on a hot key, 2026-12-07), so a server has one only
// when it exports spans.
func (t *Telemetry) GRPCServer() *ServerCalls {
	h := t.grpcHandler(true)
	c := &ServerCalls{h: h}
	if h.spans != nil {
		c.spans = h
	}
	return c
}

// ServerCalls is a gRPC server's instrumentation; see GRPCServer.
type ServerCalls struct {
	h     *rpcStats
	spans stats.Handler // nil when traces are not exported
}

// StatsHandler returns the server's span handler, or nil when traces are not
// exported (the server then needs none).
func (c *ServerCalls) StatsHandler() stats.Handler { return c.spans }

// Wrap returns desc with its handlers timed, and run in the caller's trace
// when no span handler put them in one of their own. A call's duration runs
// from its handler's start (before the request is read) to its return, with
// the status the handler or the request's reading returned. Health checks
// are probes, like /healthz: desc is returned as it is.
func (c *ServerCalls) Wrap(desc *grpc.ServiceDesc) *grpc.ServiceDesc {
	if desc.ServiceName == healthService {
		return desc
	}
	d := *desc
	d.Methods = slices.Clone(desc.Methods)
	for i, m := range d.Methods {
		method, handle := "/"+desc.ServiceName+"/"+m.MethodName, m.Handler
		d.Methods[i].Handler = func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			began := time.Now()
			ctx = c.start(ctx)
			resp, err := handle(srv, ctx, dec, ic)
			c.done(ctx, method, began, err)
			return resp, err
		}
	}
	d.Streams = slices.Clone(desc.Streams)
	for i, st := range d.Streams {
		method, handle := "/"+desc.ServiceName+"/"+st.StreamName, st.Handler
		d.Streams[i].Handler = func(srv any, ss grpc.ServerStream) error {
			began := time.Now()
			ctx := ss.Context()
			if traced := c.start(ctx); traced != ctx {
				ctx, ss = traced, &tracedStream{ServerStream: ss, ctx: traced}
			}
			err := handle(srv, ss)
			c.done(ctx, method, began, err)
			return err
		}
	}
	return &d
}

const healthService = "grpc.health.v1.Health"

// start returns the context a call's handler runs in: with no span handler,
// the caller's trace, so that it goes on through this service's own calls.
// Looked up first, as most calls carry none: FromIncomingContext copies
// every header, 2.5% of the limiter's CPU at 12k decisions/s.
func (c *ServerCalls) start(ctx context.Context) context.Context {
	if c.spans != nil || len(metadata.ValueFromIncomingContext(ctx, "traceparent")) == 0 {
		return ctx
	}
	md, _ := metadata.FromIncomingContext(ctx)
	return propagator.Extract(ctx, metadataCarrier(md))
}

// done records a call's duration with its method and status (a context
// error as gRPC answers it: CANCELLED, DEADLINE_EXCEEDED).
func (c *ServerCalls) done(ctx context.Context, method string, began time.Time, err error) {
	code := codes.OK
	if err != nil {
		st, ok := status.FromError(err)
		if !ok {
			st = status.FromContextError(err)
		}
		code = st.Code()
	}
	c.h.duration.Record(ctx, time.Since(began).Seconds(), c.h.attrs(method, code).Record...)
}

// tracedStream is a stream whose handler runs in the caller's trace.
type tracedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *tracedStream) Context() context.Context { return s.ctx }

// GRPCClientOptions instrument a gRPC client connection: the
// rpc.client.call.duration histogram, a client span per call when traces are
// exported, and the caller's trace context sent on every call.
//
// Unary calls are timed by an interceptor, with the error the caller gets:
// grpc-go (1.85) can report a call's end to stats handlers as a success when
// the server answered with an error before SendMsg returned (the attempt is
// finished with SendMsg's io.EOF, which it takes for success), so a stats
// handler alone would count some failed calls as OK.
func (t *Telemetry) GRPCClientOptions() []grpc.DialOption {
	h := t.grpcHandler(false)
	return []grpc.DialOption{grpc.WithStatsHandler(h), grpc.WithChainUnaryInterceptor(h.timeUnary)}
}

// rpcStats records call durations with one attribute set per (method,
// status) built once, instead of otelgrpc's per-call attribute slices and
// set hashing (about 15% of the limiter's CPU per decision when profiled):
// a client's as a stats handler, a server's through ServerCalls, for which
// it is a stats handler only to pass the calls to otelgrpc's spans. Spans
// are otelgrpc's, and only when something records them: with no exporter a
// sampler that never samples still made otelgrpc build every call's span
// attributes.
type rpcStats struct {
	server   bool
	spans    stats.Handler // nil when traces are not exported
	duration metric.Float64Histogram
	sets     *AttrSets[rpcKey]
}

type rpcKey struct {
	method string
	code   codes.Code
}

// rpcMethodKey holds the call's full method name in its context.
type rpcMethodKey struct{}

// timedKey marks a client call whose duration the unary interceptor records.
type timedKey struct{}

func (t *Telemetry) grpcHandler(server bool) *rpcStats {
	meter := t.MeterProvider.Meter("kurz.dev/pkg/telemetry")
	name, desc := "rpc.client.call.duration", "Duration of outgoing gRPC calls"
	if server {
		name, desc = "rpc.server.call.duration", "Duration of incoming gRPC calls"
	}
	h := &rpcStats{server: server, sets: NewAttrSets[rpcKey](SeriesLimit, Overflow)}
	var err error
	h.duration, err = meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
	if err != nil {
		otel.Handle(err)
		h.duration = metricnoop.Float64Histogram{}
	}
	if t.Tracing {
		opts := []otelgrpc.Option{
			otelgrpc.WithTracerProvider(t.TracerProvider),
			otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
			// Health checks are probes, like /healthz: no spans.
			otelgrpc.WithFilter(filters.Not(filters.HealthCheck())),
		}
		if server {
			h.spans = otelgrpc.NewServerHandler(opts...)
		} else {
			h.spans = otelgrpc.NewClientHandler(opts...)
		}
	}
	return h
}

var propagator = propagation.TraceContext{}

func (h *rpcStats) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if strings.HasPrefix(info.FullMethodName, "/"+healthService+"/") {
		return ctx
	}
	switch {
	case h.spans != nil:
		ctx = h.spans.TagRPC(ctx, info)
	case h.server:
		// A server has this handler only to record spans.
	default:
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			md, _ := metadata.FromOutgoingContext(ctx)
			md = md.Copy()
			propagator.Inject(ctx, metadataCarrier(md))
			ctx = metadata.NewOutgoingContext(ctx, md)
		}
	}
	return context.WithValue(ctx, rpcMethodKey{}, info.FullMethodName)
}

func (h *rpcStats) HandleRPC(ctx context.Context, rs stats.RPCStats) {
	method, ok := ctx.Value(rpcMethodKey{}).(string)
	if !ok {
		// A health check, which TagRPC left untagged: otelgrpc would take
		// the caller's span for the call's own and end it.
		return
	}
	if h.spans != nil {
		h.spans.HandleRPC(ctx, rs)
	}
	if h.server {
		return // timed by ServerCalls.Wrap
	}
	end, ok := rs.(*stats.End)
	if !ok || ctx.Value(timedKey{}) != nil {
		return
	}
	h.duration.Record(ctx, end.EndTime.Sub(end.BeginTime).Seconds(), h.attrs(method, status.Code(end.Error)).Record...)
}

// timeUnary records a unary client call's duration with the status its
// caller gets.
func (h *rpcStats) timeUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if strings.HasPrefix(method, "/grpc.health.v1.Health/") {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	start := time.Now()
	err := invoker(context.WithValue(ctx, timedKey{}, true), method, req, reply, cc, opts...)
	h.duration.Record(ctx, time.Since(start).Seconds(), h.attrs(method, status.Code(err)).Record...)
	return err
}

// attrs returns the attribute set of a call's method and status, built on
// first use.
func (h *rpcStats) attrs(method string, code codes.Code) Opts {
	return h.sets.Get(rpcKey{method, code}, func() []attribute.KeyValue {
		kv := []attribute.KeyValue{
			semconv.RPCSystemNameGRPC,
			semconv.RPCMethod(strings.TrimPrefix(method, "/")),
			semconv.RPCResponseStatusCode(codeName(code)),
		}
		if h.isError(code) {
			kv = append(kv, semconv.ErrorTypeKey.String(codeName(code)))
		}
		return kv
	})
}

// isError follows the semantic conventions: a client counts every status but
// OK as an error; a server only those that are its own fault.
func (h *rpcStats) isError(c codes.Code) bool {
	if !h.server {
		return c != codes.OK
	}
	switch c {
	case codes.Unknown, codes.DeadlineExceeded, codes.Unimplemented, codes.Internal, codes.Unavailable, codes.DataLoss:
		return true
	}
	return false
}

// codeNames are the canonical status code names (as gRPC's spec spells
// them: CANCELLED, not Go's Canceled).
var codeNames = [...]string{
	codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN",
	codes.InvalidArgument: "INVALID_ARGUMENT", codes.DeadlineExceeded: "DEADLINE_EXCEEDED",
	codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED",
	codes.OutOfRange: "OUT_OF_RANGE", codes.Unimplemented: "UNIMPLEMENTED", codes.Internal: "INTERNAL",
	codes.Unavailable: "UNAVAILABLE", codes.DataLoss: "DATA_LOSS", codes.Unauthenticated: "UNAUTHENTICATED",
}

func codeName(c codes.Code) string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return "UNKNOWN"
}

func (h *rpcStats) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	if h.spans != nil {
		return h.spans.TagConn(ctx, info)
	}
	return ctx
}

func (h *rpcStats) HandleConn(ctx context.Context, s stats.ConnStats) {
	if h.spans != nil {
		h.spans.HandleConn(ctx, s)
	}
}

// metadataCarrier adapts gRPC metadata to the propagators.
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
