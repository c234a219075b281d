// Package telemetry sets up OpenTelemetry for a kurz service: traces exported
// over OTLP when an endpoint is configured (off otherwise), and metrics
// exposed for Prometheus scraping on the service's /metrics.
//
// Traces follow OpenTelemetry's own environment variables, as any
// OpenTelemetry SDK does: OTEL_EXPORTER_OTLP_ENDPOINT (or _TRACES_ENDPOINT),
// _PROTOCOL (http/protobuf, the specification's default, or grpc), _HEADERS,
// _INSECURE, _TIMEOUT and _CERTIFICATE; OTEL_TRACES_EXPORTER (otlp or
// none); OTEL_TRACES_SAMPLER and _ARG; OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES; OTEL_SDK_DISABLED. KURZ_OTLP_ENDPOINT, kurz's
// older name, still selects OTLP/gRPC to host:port and wins over them.
// Unlike the specification's default, nothing is exported unless an
// endpoint is set or OTEL_TRACES_EXPORTER=otlp asks for the default one.
package telemetry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/logging"
)

// Config selects where traces go and how many are kept.
type Config struct {
	// OTLPEndpoint is host:port of an OTLP/gRPC collector. Empty leaves the
	// choice to the OpenTelemetry variables (OTEL_EXPORTER_OTLP_ENDPOINT and
	// the others, docs/operations.md); with neither, tracing is off.
	OTLPEndpoint string `env:"OTLP_ENDPOINT" default:""`
	// OTLPInsecure sends traces without TLS (a collector on the pod network).
	OTLPInsecure bool `env:"OTLP_INSECURE" default:"true"`
	// TraceSampleRatio is the share of root traces kept; children follow
	// their parent. OTEL_TRACES_SAMPLER, when set, decides instead.
	TraceSampleRatio float64 `env:"TRACE_SAMPLE_RATIO" default:"1"`
	// FlushTimeout bounds Shutdown's flush of buffered spans and metrics
	// when a service stops; it has its own budget, after the drain's.
	FlushTimeout time.Duration `env:"TELEMETRY_FLUSH_TIMEOUT" default:"5s"`
	// SpanProcessor is for tests: when set, every root trace is sampled and
	// each span goes to it (e.g. a tracetest.SpanRecorder) besides any OTLP
	// exporter. It has no env tag, so no environment variable can set it.
	SpanProcessor sdktrace.SpanProcessor
}

// Telemetry holds the providers of one service. Pass them explicitly (to
// otelgrpc, to instruments) rather than relying on the globals, which Setup
// sets only for libraries that read them.
type Telemetry struct {
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// Metrics serves the Prometheus text format of this service's registry.
	Metrics http.Handler
	// Tracing says whether spans are recorded somewhere (an OTLP exporter
	// or a test's span processor); instrumentation skips span work when not.
	Tracing  bool
	shutdown []func(context.Context) error
}

// Check refuses settings Setup cannot use (server.Main runs it with the
// other checks, so every refused setting is named at once).
func (c Config) Check() error {
	// Asked the right way round, so that NaN, which compares false with
	// everything, fails it too.
	if !(c.TraceSampleRatio >= 0 && c.TraceSampleRatio <= 1) {
		return fmt.Errorf("KURZ_TRACE_SAMPLE_RATIO=%v: want a number from 0 to 1", c.TraceSampleRatio)
	}
	// Without a port, or as a URL, the exporter failed at every export.
	if c.OTLPEndpoint != "" {
		if err := config.HostPort(c.OTLPEndpoint); err != nil {
			return fmt.Errorf("KURZ_OTLP_ENDPOINT: %w", err)
		}
	}
	return nil
}

// Setup builds the providers. Call Shutdown with a deadline before exit so
// buffered spans are flushed.
func Setup(ctx context.Context, cfg Config, service, version string) (*Telemetry, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the
	// service's own name, as an operator who sets them expects.
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		semconv.ServiceName(service), semconv.ServiceVersion(version)))
	if err == nil {
		res, err = resource.Merge(res, resource.Environment())
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	t := &Telemetry{}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mpOpts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(exporter)}
	if os.Getenv("OTEL_METRICS_EXEMPLAR_FILTER") == "" {
		// /metrics serves the Prometheus text format, which has no
		// exemplars: the SDK's default filter would still look for a span
		// in every measurement's context (a walk up the context chain on
		// every decision and request) to keep exemplars nobody reads.
		mpOpts = append(mpOpts, sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter))
	}
	mp := sdkmetric.NewMeterProvider(mpOpts...)
	t.MeterProvider = mp
	installErrorHandler()
	if _, err := mp.Meter("kurz.dev/pkg/telemetry").Int64ObservableCounter(MetricErrors,
		metric.WithDescription("Errors the OpenTelemetry SDK reported in this process: mostly span exports that failed or were refused (their spans are lost)"),
		metric.WithUnit("{error}"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(sdkErrors.Load())
			return nil
		})); err != nil {
		return nil, fmt.Errorf("telemetry metrics: %w", err)
	}
	t.Metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	t.shutdown = append(t.shutdown, mp.Shutdown)

	exp, err := traceExporter(ctx, cfg)
	if err != nil {
		return nil, err
	}
	// Without an exporter there is nowhere to send spans: start no sampled
	// trace here, so instrumented hot paths do not pay for recording them,
	// but keep a caller's sampled trace going (its context reaches the
	// services that do export, as the click events carry it).
	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res), sdktrace.WithRawSpanLimits(spanLimits())}
	switch {
	case cfg.SpanProcessor != nil:
		tpOpts = append(tpOpts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())),
			sdktrace.WithSpanProcessor(cfg.SpanProcessor))
	case exp == nil:
		tpOpts = append(tpOpts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())))
	case os.Getenv("OTEL_TRACES_SAMPLER") != "":
		// The SDK reads OTEL_TRACES_SAMPLER and _ARG itself.
	default:
		tpOpts = append(tpOpts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.TraceSampleRatio))))
	}
	if exp != nil {
		tpOpts = append(tpOpts, sdktrace.WithBatcher(exp))
	}
	t.Tracing = exp != nil || cfg.SpanProcessor != nil
	tp := sdktrace.NewTracerProvider(tpOpts...)
	t.TracerProvider = tp
	t.shutdown = append(t.shutdown, tp.Shutdown)

	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return t, nil
}

// MetricErrors counts the errors the OpenTelemetry SDK reports.
const MetricErrors = "kurz.telemetry.errors"

// sdkErrors and sdkErrorLogs are the process's: the SDK has one error
// handler per process.
var (
	sdkErrors    atomic.Int64
	sdkErrorLogs logging.Every
)

// installErrorHandler counts the SDK's errors (a span export refused or
// failed: its spans are lost) and logs one a second as a warning, with
// the count left out since the last. The SDK's default wrote every one,
// as an unlabelled line, and counted nothing an operator could watch.
var installErrorHandler = sync.OnceFunc(func() {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		sdkErrors.Add(1)
		if n, ok := sdkErrorLogs.Allow(); ok {
			slog.Default().Warn("opentelemetry: "+err.Error(), "component", "otel", "errors_not_logged", n)
		}
	}))
})

// MaxAttributeValue is the longest string value a span attribute keeps
// (longer ones are cut) unless OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT says
// otherwise. The SDK keeps any length by default, and strangers choose
// some values (the User-Agent, up to the 64 KiB of headers a server
// reads): 60 KB on every span of their requests made export batches larger
// than collectors accept (4 MiB over gRPC), which refused them whole, the
// spans of everyone else's requests with them.
const MaxAttributeValue = 1024

// spanLimits are the SDK's limits, from the OTEL_SPAN_*_LIMIT variables,
// with attribute values bounded by MaxAttributeValue unless set.
func spanLimits() sdktrace.SpanLimits {
	l := sdktrace.NewSpanLimits()
	if _, set := os.LookupEnv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT"); !set {
		l.AttributeValueLengthLimit = MaxAttributeValue
	}
	return l
}

// traceExporter is the span exporter the configuration asks for, or nil
// when traces go nowhere (see the package comment for the variables).
func traceExporter(ctx context.Context, cfg Config) (sdktrace.SpanExporter, error) {
	if disabled, _ := strconv.ParseBool(os.Getenv("OTEL_SDK_DISABLED")); disabled {
		return nil, nil
	}
	if cfg.OTLPEndpoint != "" {
		opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(cfg.OTLPEndpoint)}
		if cfg.OTLPInsecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		exp, err := otlptracegrpc.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("otlp trace exporter for %s (KURZ_OTLP_ENDPOINT): %w", cfg.OTLPEndpoint, err)
		}
		return exp, nil
	}
	switch e := os.Getenv("OTEL_TRACES_EXPORTER"); e {
	case "none":
		return nil, nil
	case "", "otlp":
		if e == "" && firstEnv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT") == "" {
			return nil, nil
		}
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: kurz exports traces over otlp (or none)", e)
	}
	// The exporters read the endpoint, headers, TLS and timeout variables
	// themselves.
	var exp sdktrace.SpanExporter
	var err error
	switch p := cmp.Or(firstEnv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf"); p {
	case "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: want http/protobuf or grpc", p)
	}
	if err != nil {
		return nil, fmt.Errorf("otlp trace exporter (OTEL_EXPORTER_OTLP_*): %w", err)
	}
	return exp, nil
}

// firstEnv is the first of the variables that is set and not empty.
func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// Shutdown flushes and stops the providers; it returns when ctx ends at the latest.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for _, fn := range t.shutdown {
		errs = append(errs, fn(ctx))
	}
	return errors.Join(errs...)
}
