package pgpool_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/pgpool"
)

func TestNewNamesTheVariableWhenUnreachable(t *testing.T) {
	_, err := pgpool.New(context.Background(), pgpool.Config{URL: "postgres://kurz:secret@127.0.0.1:1/kurz?sslmode=disable", MaxConns: 1, QueryTimeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "KURZ_POSTGRES_URL") {
		t.Fatalf("got %v, want an error naming KURZ_POSTGRES_URL", err)
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error leaks the password: %v", err)
	}
}

// A pool size that int32 would wrap (to 1 for 2^32+1) or that means
// nothing is refused by name.
func TestNewRefusesUnusableSettingsByName(t *testing.T) {
	for _, n := range []int{0, -1, 1<<32 + 1} {
		_, err := pgpool.New(context.Background(), pgpool.Config{URL: "postgres://kurz@127.0.0.1:1/kurz", MaxConns: n, QueryTimeout: time.Second})
		if err == nil || !strings.Contains(err.Error(), "KURZ_POSTGRES_MAX_CONNS") {
			t.Errorf("MaxConns %d: got %v, want an error naming KURZ_POSTGRES_MAX_CONNS", n, err)
		}
	}
}
