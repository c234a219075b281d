package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
)

func TestNewJSONCarriesServiceAndHonoursLevel(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, Config{Level: "warn", Format: "json"}, "limiter")
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	log.Info("dropped")
	log.Warn("kept", "rule", "per-ip")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("got %d lines, want 1 (info filtered out): %q", len(lines), buf.String())
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &got); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	if got["service"] != "limiter" || got["msg"] != "kept" || got["rule"] != "per-ip" {
		t.Errorf("got %v", got)
	}
}

func TestNewRejectsUnknownSettings(t *testing.T) {
	for name, cfg := range map[string]Config{
		"KURZ_LOG_LEVEL":  {Level: "loud", Format: "json"},
		"KURZ_LOG_FORMAT": {Level: "info", Format: "xml"},
		// A ticker this fast spins the flusher.
		"KURZ_LOG_FLUSH_INTERVAL": {Level: "info", Format: "json", FlushInterval: time.Millisecond},
	} {
		if _, err := New(&bytes.Buffer{}, cfg, "x"); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%+v: %v, want an error naming %s", cfg, err, name)
		}
	}
}

// A line logged with a context inside a span names the span's trace and
// span; a line without one names neither.
func TestLinesInsideASpanCarryItsIDs(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, Config{Level: "info", Format: "json"}, "redirect")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	log.With("code", "abc").InfoContext(trace.ContextWithSpanContext(context.Background(), sc), "inside")
	log.InfoContext(context.Background(), "outside")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2: %q", len(lines), buf.String())
	}
	var inside, outside map[string]any
	if json.Unmarshal([]byte(lines[0]), &inside) != nil || json.Unmarshal([]byte(lines[1]), &outside) != nil {
		t.Fatalf("not JSON: %q", buf.String())
	}
	if inside["trace_id"] != sc.TraceID().String() || inside["span_id"] != sc.SpanID().String() || inside["code"] != "abc" {
		t.Errorf("inside a span: %v, want trace_id %s, span_id %s and the logger's attributes", inside, sc.TraceID(), sc.SpanID())
	}
	if _, ok := outside["trace_id"]; ok {
		t.Errorf("outside a span: %v, want no trace_id", outside)
	}
}
