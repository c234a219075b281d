// Package pgpool builds the PostgreSQL connection pool and applies a
// component's schema migrations.
package pgpool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Config locates the database.
type Config struct {
	// URL is the PostgreSQL connection string.
	URL string `env:"POSTGRES_URL" default:"postgres://kurz:kurz@127.0.0.1:5433/kurz?sslmode=disable"`
	// MaxConns is the PostgreSQL pool's size (1 to 10,000); every pod's add up against max_connections (deploy/k8s/README.md).
	MaxConns int `env:"POSTGRES_MAX_CONNS" default:"16"`
	// QueryTimeout bounds one statement; the read path must not hang on a
	// sick database.
	QueryTimeout time.Duration `env:"POSTGRES_QUERY_TIMEOUT" default:"2s"`
}

// maxConns bounds KURZ_POSTGRES_MAX_CONNS (PostgreSQL's own default
// max_connections is 100).
const maxConns = 10_000

// Check refuses settings the pool cannot use, naming the variable.
func (c Config) Check() error {
	var errs []error
	if c.MaxConns < 1 || c.MaxConns > maxConns {
		errs = append(errs, fmt.Errorf("KURZ_POSTGRES_MAX_CONNS=%d: want 1 to %d", c.MaxConns, maxConns))
	}
	if c.QueryTimeout <= 0 {
		errs = append(errs, fmt.Errorf("KURZ_POSTGRES_QUERY_TIMEOUT=%s: want more than 0", c.QueryTimeout))
	}
	return errors.Join(errs...)
}

// New opens a pool and pings the server. The error names the variable to set
// but never echoes the URL, which may hold a password.
func New(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	if err := cfg.Check(); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("postgres: KURZ_POSTGRES_URL is not a valid connection string: %w", err)
	}
	pc.MaxConns = int32(cfg.MaxConns)
	// A burst fills the pool; idle connections close after a minute (pgx
	// keeps them half an hour), so every pod's pool does not stay at its
	// size in PostgreSQL's max_connections long after the burst.
	pc.MaxConnIdleTime = time.Minute
	pc.ConnConfig.ConnectTimeout = 3 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres at %s:%d: no working connection (check KURZ_POSTGRES_URL: address, user, password, database): %w", pc.ConnConfig.Host, pc.ConnConfig.Port, err)
	}
	return pool, nil
}
