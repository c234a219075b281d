package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// receiver is an in-process OTLP trace receiver: what arrived, and the
// x-tenant header each export carried.
type receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu      sync.Mutex
	spans   []*tracepb.ResourceSpans
	headers []string
}

func (r *receiver) add(req *collectortrace.ExportTraceServiceRequest, tenant string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spans = append(r.spans, req.GetResourceSpans()...)
	r.headers = append(r.headers, tenant)
}

func (r *receiver) Export(ctx context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	r.add(req, strings.Join(md.Get("x-tenant"), ","))
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// grpcReceiver serves OTLP/gRPC on a loopback port until the test ends.
func grpcReceiver(t *testing.T) (*receiver, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &receiver{}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, r)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return r, lis.Addr().String()
}

// httpReceiver serves OTLP/HTTP (protobuf) on a loopback port until the
// test ends.
func httpReceiver(t *testing.T) (*receiver, string) {
	t.Helper()
	r := &receiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		var msg collectortrace.ExportTraceServiceRequest
		if err != nil || req.URL.Path != "/v1/traces" || proto.Unmarshal(body, &msg) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		r.add(&msg, req.Header.Get("X-Tenant"))
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return r, srv.URL
}

// exportOneSpan sets telemetry up from cfg and the environment, records
// one span and shuts down (which flushes it).
func exportOneSpan(t *testing.T, cfg Config) *Telemetry {
	t.Helper()
	tel, err := Setup(context.Background(), cfg, "limiter", "test")
	if err != nil {
		t.Fatal(err)
	}
	_, span := tel.TracerProvider.Tracer("test").Start(context.Background(), "decide")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	return tel
}

func resourceAttr(rs *tracepb.ResourceSpans, key string) string {
	for _, kv := range rs.GetResource().GetAttributes() {
		if kv.GetKey() == key {
			return anyString(kv.GetValue())
		}
	}
	return ""
}

func anyString(v *commonpb.AnyValue) string { return v.GetStringValue() }

// checkExported fails unless r received exactly the span "decide" from a
// resource named service, with the test's resource attribute and header.
func checkExported(t *testing.T, r *receiver, service string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.spans) != 1 || len(r.spans[0].GetScopeSpans()) != 1 || len(r.spans[0].GetScopeSpans()[0].GetSpans()) != 1 {
		t.Fatalf("received %d resource spans, want one with one span: %v", len(r.spans), r.spans)
	}
	rs := r.spans[0]
	if name := rs.GetScopeSpans()[0].GetSpans()[0].GetName(); name != "decide" {
		t.Errorf("span %q, want decide", name)
	}
	if got := resourceAttr(rs, "service.name"); got != service {
		t.Errorf("service.name %q, want %q", got, service)
	}
	if got := resourceAttr(rs, "deployment.environment"); got != "test" {
		t.Errorf("deployment.environment %q, want test (OTEL_RESOURCE_ATTRIBUTES)", got)
	}
	if r.headers[0] != "acme" {
		t.Errorf("x-tenant header %q, want acme (OTEL_EXPORTER_OTLP_HEADERS)", r.headers[0])
	}
}

func setOTelEnv(t *testing.T, kv ...string) {
	t.Helper()
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=acme")
	for i := 0; i+1 < len(kv); i += 2 {
		t.Setenv(kv[i], kv[i+1])
	}
}

// The standard variables alone send traces over OTLP/HTTP, the
// specification's default protocol, to the endpoint with its headers, under
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
func TestOTLPOverHTTPFromTheStandardVariables(t *testing.T) {
	r, url := httpReceiver(t)
	setOTelEnv(t, "OTEL_EXPORTER_OTLP_ENDPOINT", url, "OTEL_SERVICE_NAME", "edge-limiter")
	if tel := exportOneSpan(t, Config{TraceSampleRatio: 1}); !tel.Tracing {
		t.Error("Tracing false with an endpoint set")
	}
	checkExported(t, r, "edge-limiter")
}

// OTEL_EXPORTER_OTLP_PROTOCOL=grpc sends them over OTLP/gRPC.
func TestOTLPOverGRPCFromTheStandardVariables(t *testing.T) {
	r, addr := grpcReceiver(t)
	setOTelEnv(t, "OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+addr, "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	exportOneSpan(t, Config{TraceSampleRatio: 1})
	checkExported(t, r, "limiter")
}

// KURZ_OTLP_ENDPOINT, the older name, still sends OTLP/gRPC, and wins over
// an OTEL_ endpoint.
func TestKurzOTLPEndpointStillWorks(t *testing.T) {
	r, addr := grpcReceiver(t)
	other, url := httpReceiver(t)
	setOTelEnv(t, "OTEL_EXPORTER_OTLP_ENDPOINT", url)
	exportOneSpan(t, Config{OTLPEndpoint: addr, OTLPInsecure: true, TraceSampleRatio: 1})
	checkExported(t, r, "limiter")
	if len(other.spans) != 0 {
		t.Errorf("the OTEL_ endpoint received %d resource spans, want none", len(other.spans))
	}
}

// OTEL_SDK_DISABLED, OTEL_TRACES_EXPORTER=none and OTEL_TRACES_SAMPLER
// always_off each keep spans home even with an endpoint set.
func TestTracesStayHomeWhenTheVariablesSaySo(t *testing.T) {
	for name, kv := range map[string][]string{
		"sdk disabled":  {"OTEL_SDK_DISABLED", "true"},
		"exporter none": {"OTEL_TRACES_EXPORTER", "none"},
		"sampler off":   {"OTEL_TRACES_SAMPLER", "always_off"},
	} {
		t.Run(name, func(t *testing.T) {
			r, url := httpReceiver(t)
			setOTelEnv(t, append([]string{"OTEL_EXPORTER_OTLP_ENDPOINT", url}, kv...)...)
			exportOneSpan(t, Config{TraceSampleRatio: 1})
			if len(r.spans) != 0 {
				t.Errorf("received %d resource spans, want none", len(r.spans))
			}
		})
	}
}

// A variable kurz cannot honour stops the service at start, naming it.
func TestUnsupportedOTelSettingsRefused(t *testing.T) {
	for name, kv := range map[string][]string{
		"exporter": {"OTEL_TRACES_EXPORTER", "zipkin"},
		"protocol": {"OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"},
	} {
		t.Run(name, func(t *testing.T) {
			setOTelEnv(t, append([]string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1"}, kv...)...)
			_, err := Setup(context.Background(), Config{TraceSampleRatio: 1}, "limiter", "test")
			if err == nil || !strings.Contains(err.Error(), kv[0]) {
				t.Errorf("Setup: %v, want an error naming %s", err, kv[0])
			}
		})
	}
}

// An error the SDK reports (an export refused: its spans are lost) is
// counted for the operator, and logged as a warning, one a second.
func TestSDKErrorsAreCounted(t *testing.T) {
	tel := setup(t, Config{}, "errs")
	before := sdkErrors.Load()
	for range 3 {
		otel.Handle(errors.New("traces export: failed to send to http://collector:4318/v1/traces: 413 Request Entity Too Large"))
	}
	want := fmt.Sprintf("kurz_telemetry_errors_total{otel_scope_name=\"kurz.dev/pkg/telemetry\",otel_scope_schema_url=\"\",otel_scope_version=\"\"} %d", before+3)
	if text := scrape(t, tel); !strings.Contains(text, want) {
		t.Errorf("no %s in:\n%s", want, text)
	}
}
