package telemetry

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// HTTPServer wraps h, the handler of the service name, with the
// http.server.request.duration histogram (by method, route and status) and,
// when traces are recorded, otelhttp's server span per request, named after
// the route. Requests for which skip reports true (probes, scrapes,
// profiles) are passed through untouched.
//
// When traces are not recorded, no span is started: a caller's traceparent
// is only taken into the request's context, so what the request starts (a
// click event, a gRPC call) carries the caller's trace on. otelhttp cost
// the redirect ~18% of its CPU per request that way (attribute sets built
// and hashed per request, metrics nobody reads).
func (t *Telemetry) HTTPServer(name string, h http.Handler, skip func(*http.Request) bool) http.Handler {
	s := &httpStats{next: h, plain: h, skip: skip, sets: NewAttrSets[httpKey](SeriesLimit, Overflow)}
	var err error
	s.duration, err = t.MeterProvider.Meter("kurz.dev/pkg/telemetry").Float64Histogram("http.server.request.duration",
		metric.WithUnit("s"), metric.WithDescription("Duration of HTTP server requests"),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
	if err != nil {
		otel.Handle(err)
		s.duration = metricnoop.Float64Histogram{}
	}
	if t.Tracing {
		s.next = otelhttp.NewHandler(tapped(h), name,
			otelhttp.WithTracerProvider(t.TracerProvider),
			otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()),
			otelhttp.WithPropagators(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})),
			// The route, not the path, keeps span names few; ServeMux fills
			// Pattern when it routes the request (otelhttp renames the span
			// after the handler), the method alone stands until then, and
			// for a request no route took: a standard method, or "_OTHER",
			// as in the metrics, so that a client's made-up methods cannot
			// add span names (tracing backends index them).
			otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
				if r.Pattern != "" {
					return r.Pattern
				}
				return standardMethod(r.Method)
			}))
	}
	s.tracing = t.Tracing
	return s
}

// routeTap carries the route a handler's request got back to httpStats.
type routeTap struct{ pattern string }

type routeTapKey struct{}

// tapped runs h, then keeps the route its request got in the request's
// tap, if it has one.
func tapped(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if t, ok := r.Context().Value(routeTapKey{}).(*routeTap); ok && r.Pattern != "" {
				t.pattern = r.Pattern
			}
		}()
		h.ServeHTTP(w, r)
	})
}

type httpStats struct {
	next     http.Handler // h, or h in otelhttp's handler
	plain    http.Handler // h alone, for the requests skipped
	skip     func(*http.Request) bool
	tracing  bool
	duration metric.Float64Histogram
	sets     *AttrSets[httpKey]
}

type httpKey struct {
	method, route string
	status        int
}

func (s *httpStats) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.skip != nil && s.skip(r) {
		s.plain.ServeHTTP(w, r)
		return
	}
	start := time.Now()
	if !s.tracing && r.Header.Get("Traceparent") != "" {
		r = r.WithContext(propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
	}
	var tap *routeTap
	if s.tracing {
		// otelhttp hands the handler a copy of r: the route the mux sets
		// on it comes back through the tap.
		tap = &routeTap{}
		r = r.WithContext(context.WithValue(r.Context(), routeTapKey{}, tap))
	}
	sw := &StatusWriter{ResponseWriter: w}
	defer func() {
		// Recorded even when the handler aborts (http.ErrAbortHandler):
		// the request took this long and ended without a full answer.
		status := sw.Status
		if status == 0 {
			status = http.StatusOK
		}
		route := r.Pattern
		if tap != nil && route == "" {
			route = tap.pattern
		}
		s.duration.Record(r.Context(), time.Since(start).Seconds(), s.attrs(r.Method, route, status).Record...)
	}()
	s.next.ServeHTTP(sw, r)
}

// attrs returns the attribute set of a request's method, route and status,
// built on first use. Methods outside the standard set are "_OTHER", so a
// client cannot grow the set.
func (s *httpStats) attrs(method, route string, status int) Opts {
	method = standardMethod(method)
	return s.sets.Get(httpKey{method, route, status}, func() []attribute.KeyValue {
		kv := []attribute.KeyValue{semconv.HTTPRequestMethodKey.String(method), semconv.HTTPResponseStatusCode(status)}
		if route != "" {
			kv = append(kv, semconv.HTTPRoute(route))
		}
		return kv
	})
}

// standardMethod is method if HTTP defines it, else "_OTHER".
func standardMethod(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return method
	}
	return "_OTHER"
}

// StatusWriter remembers the status of the response it passes through
// (0 until the handler writes). Flush and Hijack reach the wrapped writer
// (streamed exports use Flush); http.ResponseController finds the rest
// through Unwrap.
type StatusWriter struct {
	http.ResponseWriter
	Status int
}

func (w *StatusWriter) WriteHeader(code int) {
	if w.Status == 0 {
		w.Status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *StatusWriter) Write(b []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *StatusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *StatusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if h, ok := w.ResponseWriter.(http.Hijacker); ok {
		return h.Hijack()
	}
	return nil, nil, errors.New("telemetry: response writer cannot hijack")
}

func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
