// Package telemetry sets up OpenTelemetry for a kurz service: traces exported
// over OTLP/gRPC when an endpoint is configured (off otherwise), and metrics
// exposed for Prometheus scraping on the service's /metrics.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Config selects where traces go and how many are kept.
type Config struct {
	// OTLPEndpoint is host:port of an OTLP/gRPC collector; empty turns tracing off.
	OTLPEndpoint string `env:"OTLP_ENDPOINT" default:""`
	// OTLPInsecure sends traces without TLS (a collector on the pod network).
	OTLPInsecure bool `env:"OTLP_INSECURE" default:"true"`
	// TraceSampleRatio is the share of root traces kept; children follow their parent.
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

// Setup builds the providers. Call Shutdown with a deadline before exit so
// buffered spans are flushed.
func Setup(ctx context.Context, cfg Config, service, version string) (*Telemetry, error) {
	if cfg.TraceSampleRatio < 0 || cfg.TraceSampleRatio > 1 {
		return nil, fmt.Errorf("KURZ_TRACE_SAMPLE_RATIO=%v: want a number from 0 to 1", cfg.TraceSampleRatio)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		semconv.ServiceName(service), semconv.ServiceVersion(version)))
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
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(exporter))
	t.MeterProvider = mp
	t.Metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	t.shutdown = append(t.shutdown, mp.Shutdown)

	// Without an exporter there is nowhere to send spans: start no sampled
	// trace here, so instrumented hot paths do not pay for recording them,
	// but keep a caller's sampled trace going (its context reaches the
	// services that do export, as the click events carry it).
	sampler := sdktrace.ParentBased(sdktrace.NeverSample())
	if cfg.OTLPEndpoint != "" {
		sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.TraceSampleRatio))
	}
	if cfg.SpanProcessor != nil {
		sampler = sdktrace.ParentBased(sdktrace.AlwaysSample())
	}
	tpOpts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sampler),
	}
	if cfg.SpanProcessor != nil {
		tpOpts = append(tpOpts, sdktrace.WithSpanProcessor(cfg.SpanProcessor))
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
		tpOpts = append(tpOpts, sdktrace.WithBatcher(exp))
	}
	t.Tracing = cfg.OTLPEndpoint != "" || cfg.SpanProcessor != nil
	tp := sdktrace.NewTracerProvider(tpOpts...)
	t.TracerProvider = tp
	t.shutdown = append(t.shutdown, tp.Shutdown)

	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return t, nil
}

// Shutdown flushes and stops the providers; it returns when ctx ends at the latest.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for _, fn := range t.shutdown {
		errs = append(errs, fn(ctx))
	}
	return errors.Join(errs...)
}
