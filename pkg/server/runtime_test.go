package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/config"
)

func TestGCPercentOnlyUnderAMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		env      map[string]string
		percent  int
		override bool
	}{
		{"memory limit, no GOGC", map[string]string{"GOMEMLIMIT": "200MiB"}, DefaultGCPercent, true},
		{"GOGC set", map[string]string{"GOMEMLIMIT": "200MiB", "GOGC": "100"}, 0, false},
		{"GOGC off", map[string]string{"GOMEMLIMIT": "200MiB", "GOGC": "off"}, 0, false},
		{"no memory limit", map[string]string{}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := gcPercent(func(k string) string { return tc.env[k] })
			if p != tc.percent || ok != tc.override {
				t.Errorf("gcPercent = %d, %v; want %d, %v", p, ok, tc.percent, tc.override)
			}
		})
	}
}

func TestStreamWorkersScaleWithCores(t *testing.T) {
	want := uint32(StreamWorkersPerCore * runtime.GOMAXPROCS(0))
	if got := (Config{}).streamWorkers(); got != want {
		t.Errorf("default stream workers = %d, want %d per core = %d", got, StreamWorkersPerCore, want)
	}
	if got := (Config{StreamWorkers: 7}).streamWorkers(); got != 7 {
		t.Errorf("stream workers set to 7 = %d", got)
	}
	if got := (Common{GRPCStreamWorkers: 9}).Config("", "").StreamWorkers; got != 9 {
		t.Errorf("KURZ_GRPC_STREAM_WORKERS=9 reaches the server as %d", got)
	}
	if got := (Common{GRPCMaxConnectionAge: 42 * time.Second}).Config("", "").MaxConnectionAge; got != 42*time.Second {
		t.Errorf("KURZ_GRPC_MAX_CONNECTION_AGE=42s reaches the server as %s", got)
	}
}

// defaultCommon is Common with every variable unset.
func defaultCommon(t *testing.T) Common {
	t.Helper()
	var c Common
	if err := config.LoadFrom(func(string) (string, bool) { return "", false }, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// Zero or negative values that the server would replace by a default are
// refused by name when they come from the environment.
func TestCommonSettingsAreChecked(t *testing.T) {
	ok := defaultCommon(t)
	if err := ok.check(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for name, bad := range map[string]func(*Common){
		"KURZ_READINESS_INTERVAL":      func(c *Common) { c.ReadinessInterval = 0 },
		"KURZ_GRPC_STREAM_WORKERS":     func(c *Common) { c.GRPCStreamWorkers = -3 },
		"KURZ_GRPC_MAX_CONNECTION_AGE": func(c *Common) { c.GRPCMaxConnectionAge = 0 },
		"KURZ_HTTP_MAX_CONNECTIONS":    func(c *Common) { c.HTTPMaxConnections = 0 },
		"KURZ_HTTP_MAX_CONNECTIONS_PER_CLIENT": func(c *Common) {
			c.HTTPMaxConnectionsPerClient = c.HTTPMaxConnections + 1
		},
		"KURZ_GRPC_MAX_CALLS": func(c *Common) { c.GRPCMaxCalls = 8 },
		// New and NewLifecycle would put their defaults in place of 0.
		"KURZ_SHUTDOWN_TIMEOUT":        func(c *Common) { c.ShutdownTimeout = 0 },
		"KURZ_CLOSE_TIMEOUT":           func(c *Common) { c.CloseTimeout = 0 },
		"KURZ_TELEMETRY_FLUSH_TIMEOUT": func(c *Common) { c.Telemetry.FlushTimeout = 0 },
	} {
		c := ok
		bad(&c)
		if err := c.check(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s out of range: got %v, want an error naming it", name, err)
		}
	}
}

// The readiness checks ping every dependency each round: an interval near
// zero (1ns kept an idle redirect at 63% of a core) is refused by name,
// 100ms and more accepted.
func TestReadinessIntervalHasAFloor(t *testing.T) {
	c := defaultCommon(t)
	for _, d := range []time.Duration{time.Nanosecond, 99 * time.Millisecond} {
		c.ReadinessInterval = d
		if err := c.check(); err == nil || !strings.Contains(err.Error(), "KURZ_READINESS_INTERVAL") {
			t.Errorf("KURZ_READINESS_INTERVAL=%s: %v, want an error naming it", d, err)
		}
	}
	c.ReadinessInterval = 100 * time.Millisecond
	if err := c.check(); err != nil {
		t.Errorf("KURZ_READINESS_INTERVAL=100ms: %v, want accepted", err)
	}
}

// checkedConfig is a service Config whose own check refuses a setting.
type checkedConfig struct{ Common }

func (checkedConfig) Check() error { return errors.New("KURZ_TEST_OWN=x: refused") }

// A service names every setting its checks refuse at once: the logging
// settings, the shared ones and its own (server.Checker), and builds
// nothing.
func TestRunNamesEveryRefusedSettingAtOnce(t *testing.T) {
	t.Setenv("KURZ_LOG_LEVEL", "loud")
	t.Setenv("KURZ_LOG_FORMAT", "xml")
	t.Setenv("KURZ_READINESS_INTERVAL", "0s")
	t.Setenv("KURZ_TRACE_SAMPLE_RATIO", "2")
	err := run(context.Background(), "test", func(context.Context, checkedConfig, *Lifecycle, *slog.Logger) (*Server, error) {
		t.Error("built a service with refused settings")
		return nil, errors.New("built")
	})
	for _, name := range []string{"KURZ_LOG_LEVEL", "KURZ_LOG_FORMAT", "KURZ_READINESS_INTERVAL", "KURZ_TRACE_SAMPLE_RATIO", "KURZ_TEST_OWN"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("run: %v; want an error naming %s", err, name)
		}
	}
}

// plainConfig is a service Config with only the shared settings.
type plainConfig struct{ Common }

// A typo in a variable's name was ignored without a word; the service now
// warns at start, naming the variable and what it may have meant, and
// never its value (which may be a secret).
func TestRunWarnsOfUnknownVariablesWithoutTheirValues(t *testing.T) {
	t.Setenv("KURZ_LOG_FLUSH_INTERVAL", "0")
	t.Setenv("KURZ_SHUTDOWN_TIMOUT", "s3cret-looking-value")
	t.Setenv("KURZ_TEST_NO_SUCH_SETTING", "s3cret-looking-value")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	err = run(context.Background(), "test", func(context.Context, plainConfig, *Lifecycle, *slog.Logger) (*Server, error) {
		return nil, errors.New("stop here")
	})
	os.Stderr = stderr
	_ = w.Close()
	out, _ := io.ReadAll(r)
	if err == nil || !strings.Contains(err.Error(), "stop here") {
		t.Fatalf("run: %v, want the build's error", err)
	}
	for _, want := range []string{
		`"msg":"unknown variable ignored","service":"test","variable":"KURZ_SHUTDOWN_TIMOUT","did_you_mean":"KURZ_SHUTDOWN_TIMEOUT"`,
		`"variable":"KURZ_TEST_NO_SUCH_SETTING","did_you_mean":""`,
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "s3cret") {
		t.Errorf("log holds a value:\n%s", out)
	}
}
