package redisconn

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/logging"
)

// go-redis's messages become the service's JSON lines, at most one a
// second, each saying how many were left out before it.
func TestGoRedisMessagesAreRateLimitedJSONLines(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	l := &goRedisLog{log: slog.New(slog.NewJSONHandler(&buf, nil)), every: logging.Every{Now: func() time.Time { return now }}}
	ctx := context.Background()
	for range 5 {
		l.Printf(ctx, "redis: dial %s: refused", "127.0.0.1:7001")
	}
	now = now.Add(time.Second)
	l.Printf(ctx, "redis: dial %s: refused", "127.0.0.1:7002")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2 (one a second):\n%s", len(lines), buf.String())
	}
	var last struct {
		Level, Msg string
		Dropped    int `json:"left_out_since_last"`
	}
	if err := json.Unmarshal([]byte(lines[1]), &last); err != nil {
		t.Fatalf("line %q is not JSON: %v", lines[1], err)
	}
	if last.Level != "WARN" || last.Msg != "redis: dial 127.0.0.1:7002: refused" || last.Dropped != 4 {
		t.Errorf("second line %+v, want a warning with the message and 4 left out", last)
	}
}
