package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
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
		"level":  {Level: "loud", Format: "json"},
		"format": {Level: "info", Format: "xml"},
	} {
		if _, err := New(&bytes.Buffer{}, cfg, "x"); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}
