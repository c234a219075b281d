package pgpool_test

import (
	"context"
	"strings"
	"testing"

	"kurz.dev/pkg/pgpool"
)

func TestNewNamesTheVariableWhenUnreachable(t *testing.T) {
	_, err := pgpool.New(context.Background(), pgpool.Config{URL: "postgres://kurz:secret@127.0.0.1:1/kurz?sslmode=disable"})
	if err == nil || !strings.Contains(err.Error(), "KURZ_POSTGRES_URL") {
		t.Fatalf("got %v, want an error naming KURZ_POSTGRES_URL", err)
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error leaks the password: %v", err)
	}
}
