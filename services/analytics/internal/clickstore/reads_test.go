//go:build integration

package clickstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/testkit/servertest"
)

// Every read GetLinkStats makes reports a ClickHouse it cannot reach as
// ErrUnavailable, and an error ClickHouse answered (here: the tables do not
// exist) as something else.
func TestReadsTellAnOutageFromAnAnswer(t *testing.T) {
	addr, err := servertest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	// Nothing listens on addr: Open does not dial, every query does.
	down, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = down.Close() })

	var cfg struct{ ClickHouse chconn.Config }
	if err := config.LoadFrom(servertest.Env(nil), &cfg); err != nil {
		t.Fatal(err)
	}
	// A database New creates and Apply never ran on: no tables.
	cfg.ClickHouse.Database = "kurz_test_empty"
	up, err := chconn.New(context.Background(), cfg.ClickHouse)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Close() })

	r := Range{Tenant: "t", Code: "abcdef", Start: time.Unix(0, 0), End: time.Unix(3600, 0)}
	reads := map[string]func(*Store) error{
		"Hourly":     func(s *Store) error { _, err := s.Hourly(context.Background(), r); return err },
		"Dims":       func(s *Store) error { _, err := s.Dims(context.Background(), r); return err },
		"Owners":     func(s *Store) error { _, err := s.Owners(context.Background(), r.Code); return err },
		"Duplicates": func(s *Store) error { _, err := s.Duplicates(context.Background(), r); return err },
	}
	for name, read := range reads {
		t.Run(name, func(t *testing.T) {
			if err := read(New(down, LayoutOf(cfg.ClickHouse))); !errors.Is(err, ErrUnavailable) {
				t.Errorf("ClickHouse down: %v, want ErrUnavailable", err)
			}
			if err := read(New(up, LayoutOf(cfg.ClickHouse))); err == nil || errors.Is(err, ErrUnavailable) {
				t.Errorf("tables missing: %v, want an error that is not ErrUnavailable", err)
			}
		})
	}
}
