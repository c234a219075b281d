// Package pgpool builds the PostgreSQL connection pool and applies a
// component's schema migrations.
package pgpool

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Config locates the database.
type Config struct {
	// URL is the PostgreSQL connection string.
	URL string `env:"POSTGRES_URL" default:"postgres://kurz:kurz@127.0.0.1:5433/kurz?sslmode=disable"`
	// MaxConns is the PostgreSQL pool's size.
	MaxConns int `env:"POSTGRES_MAX_CONNS" default:"16"`
	// QueryTimeout bounds one statement; the read path must not hang on a
	// sick database.
	QueryTimeout time.Duration `env:"POSTGRES_QUERY_TIMEOUT" default:"2s"`
}

// New opens a pool and pings the server. The error names the variable to set
// but never echoes the URL, which may hold a password.
func New(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("postgres: KURZ_POSTGRES_URL is not a valid connection string: %w", err)
	}
	if cfg.MaxConns > 0 {
		pc.MaxConns = int32(cfg.MaxConns)
	}
	pc.ConnConfig.ConnectTimeout = 3 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres at %s:%d unreachable (set KURZ_POSTGRES_URL): %w", pc.ConnConfig.Host, pc.ConnConfig.Port, err)
	}
	return pool, nil
}
