package config

import (
	"strings"
	"testing"
	"time"
)

type redisBlock struct {
	Addrs   []string      `env:"REDIS_ADDRS" default:"127.0.0.1:7001,127.0.0.1:7002"`
	Timeout time.Duration `env:"REDIS_TIMEOUT" default:"5ms"`
}

type sample struct {
	Name    string  `env:"NAME" default:"kurz"`
	Workers int     `env:"WORKERS" default:"4"`
	Ratio   float64 `env:"RATIO" default:"0.5"`
	Debug   bool    `env:"DEBUG" default:"false"`
	Secret  string  `env:"SECRET"`
	Redis   redisBlock
}

func env(m map[string]string) Lookup {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestLoadFromDefaultsAndOverrides(t *testing.T) {
	var got sample
	err := LoadFrom(env(map[string]string{
		"KURZ_SECRET":        "s3",
		"KURZ_WORKERS":       "8",
		"KURZ_REDIS_TIMEOUT": "20ms",
		"KURZ_DEBUG":         "true",
	}), &got)
	if err != nil {
		t.Fatalf("LoadFrom: %v", err)
	}
	if got.Name != "kurz" || got.Workers != 8 || got.Ratio != 0.5 || !got.Debug || got.Secret != "s3" {
		t.Errorf("scalars: got %+v", got)
	}
	if got.Redis.Timeout != 20*time.Millisecond {
		t.Errorf("nested duration: got %v, want 20ms", got.Redis.Timeout)
	}
	if want := []string{"127.0.0.1:7001", "127.0.0.1:7002"}; strings.Join(got.Redis.Addrs, ",") != strings.Join(want, ",") {
		t.Errorf("list default: got %v, want %v", got.Redis.Addrs, want)
	}
}

func TestLoadFromReportsEveryProblemByName(t *testing.T) {
	var got sample
	err := LoadFrom(env(map[string]string{
		"KURZ_WORKERS":       "many",
		"KURZ_REDIS_TIMEOUT": "-1s",
	}), &got)
	if err == nil {
		t.Fatal("LoadFrom: want an error, got nil")
	}
	for _, want := range []string{"KURZ_SECRET is required", `KURZ_WORKERS="many": not an integer`, `KURZ_REDIS_TIMEOUT="-1s": must not be negative`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestLoadFromSplitsAndTrimsLists(t *testing.T) {
	var got sample
	err := LoadFrom(env(map[string]string{"KURZ_SECRET": "x", "KURZ_REDIS_ADDRS": " a:1 , ,b:2 "}), &got)
	if err != nil {
		t.Fatalf("LoadFrom: %v", err)
	}
	if strings.Join(got.Redis.Addrs, "|") != "a:1|b:2" {
		t.Errorf("got %q, want a:1|b:2", got.Redis.Addrs)
	}
}

func TestLoadRejectsNonPointer(t *testing.T) {
	if err := LoadFrom(env(nil), sample{}); err == nil {
		t.Fatal("want an error for a non-pointer")
	}
}
