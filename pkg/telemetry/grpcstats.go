package telemetry

import (
	"context"
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

// GRPCServerHandler is the stats handler of a gRPC server: the
// rpc.server.call.duration histogram of every call but health checks, and a
// server span per call when traces are exported.
func (t *Telemetry) GRPCServerHandler() stats.Handler { return t.grpcHandler(true) }

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
// set hashing (about 15% of the limiter's CPU per decision when profiled).
// Spans are otelgrpc's, and only when something records them: with no
// exporter a sampler that never samples still made otelgrpc build every
// call's span attributes.
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
	if strings.HasPrefix(info.FullMethodName, "/grpc.health.v1.Health/") {
		return ctx
	}
	switch {
	case h.spans != nil:
		ctx = h.spans.TagRPC(ctx, info)
	case h.server:
		// Nothing records spans here, but a caller's trace goes on
		// through this service's own calls. Looked up first, as most
		// calls carry none: FromIncomingContext copies every header, 2.5%
		// of the limiter's CPU at 12k decisions/s.
		if len(metadata.ValueFromIncomingContext(ctx, "traceparent")) > 0 {
			md, _ := metadata.FromIncomingContext(ctx)
			ctx = propagator.Extract(ctx, metadataCarrier(md))
		}
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
