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
	"regexp"
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
	for _, a := range cfg.Addrs {
		if err := config.HostPort(a); err != nil {
			return nil, fmt.Errorf("clickhouse: KURZ_CLICKHOUSE_ADDRS: %w", err)
		}
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
		err = ApplyDDL(ctx, boot, []string{"CREATE DATABASE IF NOT EXISTS " + cfg.Database + cfg.OnCluster()})
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
		if refusedLogin(err) {
			return nil, fmt.Errorf("clickhouse at %s refused the login (check KURZ_CLICKHOUSE_USER and KURZ_CLICKHOUSE_PASSWORD): %w", strings.Join(cfg.Addrs, ","), err)
		}
		return nil, fmt.Errorf("clickhouse at %s unreachable (set KURZ_CLICKHOUSE_ADDRS): %w", strings.Join(cfg.Addrs, ","), err)
	}
	return conn, nil
}

// refusedLogin reports whether ClickHouse answered err to a login it
// refuses: an unknown user, a wrong or missing password (UNKNOWN_USER,
// WRONG_PASSWORD, REQUIRED_PASSWORD; AUTHENTICATION_FAILED in newer
// servers). The server names the user, never the password.
func refusedLogin(err error) bool {
	var exception *clickhouse.Exception
	if !errors.As(err, &exception) {
		return false
	}
	switch exception.Code {
	case 192, 193, 194, 516:
		return true
	}
	return false
}

// DDLTimeout is how long an ON CLUSTER statement waits for the cluster's
// servers to run it (distributed_ddl_task_timeout, whole seconds; the
// servers that are up take well under a second). ClickHouse's default,
// 180 s, made a start with one server down wait that long per statement
// and then fail.
const DDLTimeout = 10 * time.Second

// ApplyDDL runs statements in order; each must be idempotent (CREATE ... IF
// NOT EXISTS), since every replica runs them at start.
//
// An ON CLUSTER statement that every server up has run, but a server that
// is down has not (ClickHouse says so when DDLTimeout passes, as
// TIMEOUT_EXCEEDED), counts as done and the next one runs: the statement
// waits in ZooKeeper's DDL queue, and the server runs the queue in order
// when it returns. Stopping there instead left the cluster half changed (a
// column upgrade dropped the Distributed click_events on every live server
// and never created it again, until the server returned).
func ApplyDDL(ctx context.Context, conn driver.Conn, statements []string) error {
	ctx = clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{
		"distributed_ddl_task_timeout": int(DDLTimeout / time.Second),
	}))
	for _, stmt := range statements {
		if err := conn.Exec(ctx, stmt); err != nil && !QueuedForDownServers(err) {
			return fmt.Errorf("clickhouse DDL %q: %w", firstLine(stmt), err)
		}
	}
	return nil
}

// ddlUnfinished match ClickHouse's TIMEOUT_EXCEEDED of an ON CLUSTER
// statement: 18.16's, then the form of later versions.
var (
	ddlUnfinished  = regexp.MustCompile(`There are \d+ unfinished hosts \((\d+) of them are currently active\)`)
	ddlNotFinished = regexp.MustCompile(
		`is not finished on (\d+) of \d+ hosts \((\d+) of them are currently executing the task, (\d+) are inactive\)`)
)

// QueuedForDownServers reports whether err is an ON CLUSTER statement's
// timeout that every server still unfinished is down (inactive): the
// servers that are up have run it, and the others will when they return.
// A server that is up and has not finished makes it an error (slow, not
// down).
func QueuedForDownServers(err error) bool {
	var exception *clickhouse.Exception
	if !errors.As(err, &exception) || exception.Code != timeoutExceeded {
		return false
	}
	if m := ddlUnfinished.FindStringSubmatch(exception.Message); m != nil {
		return m[1] == "0"
	}
	if m := ddlNotFinished.FindStringSubmatch(exception.Message); m != nil {
		return m[2] == "0" && m[1] == m[3]
	}
	return false
}

// timeoutExceeded is ClickHouse's TIMEOUT_EXCEEDED.
const timeoutExceeded = 159

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
