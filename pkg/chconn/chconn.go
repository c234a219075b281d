// Package chconn builds the ClickHouse connection (native protocol) and
// applies idempotent DDL. Everything here must work on ClickHouse 18.16 (the
// Debian package used locally) and on current 24.x: batches name their
// columns, and no statement relies on newer syntax.
package chconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"kurz.dev/pkg/config"
)

// Config locates the server and the database.
type Config struct {
	// Addrs is the ClickHouse native-protocol addresses (host:port, comma-separated).
	Addrs []string `env:"CLICKHOUSE_ADDRS" default:"127.0.0.1:9000"`
	// Database is the ClickHouse database, created if missing.
	Database string `env:"CLICKHOUSE_DATABASE" default:"kurz"`
	// User is the ClickHouse user.
	User string `env:"CLICKHOUSE_USER" default:"default"`
	// Password is the ClickHouse user's password.
	Password string `env:"CLICKHOUSE_PASSWORD" default:""`
	// DialTimeout bounds connecting; queries carry their own deadlines.
	DialTimeout time.Duration `env:"CLICKHOUSE_DIAL_TIMEOUT" default:"3s"`
	// Cluster is the ClickHouse cluster (a remote_servers name) to create
	// the database and tables on, ON CLUSTER; empty: one server.
	Cluster string `env:"CLICKHOUSE_CLUSTER" default:""`
	// TLS connects over TLS (TLS 1.2 or later, the server's certificate
	// verified for the address dialled; the native protocol's secure port,
	// 9440 by default): required to cross a network others can read, as
	// the password goes in the first packet.
	TLS bool `env:"CLICKHOUSE_TLS" default:"false"`
	// TLSCAFile is a PEM file of the certificates that sign the servers'
	// (a private CA's); empty: the system's roots. Only with
	// KURZ_CLICKHOUSE_TLS.
	TLSCAFile string `env:"CLICKHOUSE_TLS_CA_FILE" default:""`
}

// OnCluster is the ON CLUSTER clause of cfg's DDL: empty for one server.
func (cfg Config) OnCluster() string {
	if cfg.Cluster == "" {
		return ""
	}
	return " ON CLUSTER " + cfg.Cluster
}

// DefaultMaxOpenConns is the pool size of New.
const DefaultMaxOpenConns = 10

// New is NewPool with DefaultMaxOpenConns connections.
func New(ctx context.Context, cfg Config) (driver.Conn, error) {
	return NewPool(ctx, cfg, DefaultMaxOpenConns)
}

// NewPool creates the database if needed, connects to it and pings the
// server: a pool of at most maxOpen connections (at least 1). A query that
// finds them all in use waits up to DialTimeout for one, then fails with
// clickhouse.ErrAcquireConnTimeout (see Busy). Work that must not wait on
// other work gets a pool of its own.
func NewPool(ctx context.Context, cfg Config, maxOpen int) (driver.Conn, error) {
	if !validIdent(cfg.Database) {
		return nil, fmt.Errorf("clickhouse: KURZ_CLICKHOUSE_DATABASE=%q: want letters, digits and underscores", cfg.Database)
	}
	if cfg.Cluster != "" && !validIdent(cfg.Cluster) {
		return nil, fmt.Errorf("clickhouse: KURZ_CLICKHOUSE_CLUSTER=%q: want letters, digits and underscores", cfg.Cluster)
	}
	tlsConfig, err := config.ClientTLS("CLICKHOUSE_TLS", cfg.TLS, cfg.TLSCAFile)
	if err != nil {
		return nil, fmt.Errorf("clickhouse: %w", err)
	}
	// The database may not exist yet, so the first connection uses "default".
	boot, err := open(ctx, cfg, tlsConfig, "default", 1)
	if err != nil {
		return nil, err
	}
	// On a cluster, only when this server lacks it: ON CLUSTER waits for
	// every node, and a start must not wait for one that is down.
	var have uint64
	err = boot.QueryRow(ctx, "SELECT count() FROM system.databases WHERE name = ?", cfg.Database).Scan(&have)
	if err == nil && have == 0 {
		err = boot.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+cfg.Database+cfg.OnCluster())
	}
	_ = boot.Close()
	if err != nil {
		return nil, fmt.Errorf("clickhouse: create database %s: %w", cfg.Database, err)
	}
	return open(ctx, cfg, tlsConfig, cfg.Database, maxOpen)
}

// Busy reports whether err, from a call on conn, is a wait for one of its
// pool's connections that ran out while every one of them was in use: the
// pool is busy, not ClickHouse unreachable. (The driver fails a connection
// that dialled too slowly with the same error, its pool not full.)
func Busy(conn driver.Conn, err error) bool {
	if !errors.Is(err, clickhouse.ErrAcquireConnTimeout) {
		return false
	}
	st := conn.Stats()
	return st.Open >= st.MaxOpenConns
}

func open(ctx context.Context, cfg Config, tlsConfig *tls.Config, database string, maxOpen int) (driver.Conn, error) {
	var settings clickhouse.Settings
	if cfg.Cluster != "" {
		// An insert into a Distributed table returns once every shard's
		// replica has stored its rows, not once they are queued on the
		// server that took it: only then may the consumer acknowledge.
		settings = clickhouse.Settings{"insert_distributed_sync": 1}
	}
	conn, err := clickhouse.Open(&clickhouse.Options{
		TLS:         tlsConfig,
		Addr:        cfg.Addrs,
		Settings:    settings,
		Auth:        clickhouse.Auth{Database: database, Username: cfg.User, Password: cfg.Password},
		DialTimeout: cfg.DialTimeout,
		Protocol:    clickhouse.Native,
		// Explicit: the driver's default (10) is no one's decision, and
		// idle connections beyond the pool are never kept.
		MaxOpenConns: max(maxOpen, 1),
		MaxIdleConns: max(maxOpen, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("clickhouse: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := conn.Ping(pctx); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("clickhouse at %s unreachable (set KURZ_CLICKHOUSE_ADDRS): %w", strings.Join(cfg.Addrs, ","), err)
	}
	return conn, nil
}

// ApplyDDL runs statements in order; each must be idempotent (CREATE ... IF
// NOT EXISTS), since every replica runs them at start.
func ApplyDDL(ctx context.Context, conn driver.Conn, statements []string) error {
	for _, stmt := range statements {
		if err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("clickhouse DDL %q: %w", firstLine(stmt), err)
		}
	}
	return nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func validIdent(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}
