// Package stack is the gate of kurz's integration tier. Test files that
// need the real stack carry the build tag `integration` (so `go test ./...`
// runs the unit tier alone), and their package's TestMain calls Require
// with what it needs: when any of it is down the binary stops at once with
// one clear line ("integration tests need the stack: make up ..."), never a
// silent skip or a slow pile of timeouts.
package stack

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/pgpool"
	"kurz.dev/pkg/redisconn"
)

// A Component is one engine of the stack.
type Component string

// The engines `make up` (deploy/local/infra.sh) starts.
const (
	Redis      Component = "Redis Cluster"
	Postgres   Component = "PostgreSQL"
	ClickHouse Component = "ClickHouse"
	// ClickHouseCluster is the ClickHouse cluster KURZ_CLICKHOUSE_CLUSTER
	// names, every server of KURZ_CLICKHOUSE_ADDRS up (deploy/local/
	// chcluster.sh starts one; `make test-chcluster` runs its tests).
	ClickHouseCluster Component = "ClickHouse cluster"
)

// All is every engine.
var All = []Component{Redis, Postgres, ClickHouse}

// Require runs m's tests if every component answers, and exits the test
// binary with a clear message if one does not. Call it from TestMain:
//
//	func TestMain(m *testing.M) { stack.Require(m, stack.Redis, stack.Postgres) }
func Require(m *testing.M, need ...Component) {
	Gate(need...)
	os.Exit(m.Run())
}

// Gate exits the test binary with Require's message if a component is down,
// and returns if all answer: for a TestMain that does more than run m (it
// starts processes on the stack first, say).
func Gate(need ...Component) {
	if err := Check(need...); err != nil {
		fmt.Fprintf(os.Stderr, "integration tests need the stack: %v\n(run `make up`, or `make test`, which starts it)\n", err)
		os.Exit(1)
	}
}

// Check dials each component at the address its service would use (the
// same KURZ_* variables and defaults), and names the first that is down.
func Check(need ...Component) error {
	for _, c := range need {
		addrs, err := addresses(c)
		if err != nil {
			return fmt.Errorf("%s: %w", c, err)
		}
		if c == ClickHouseCluster {
			if err := dialAll(addrs); err != nil {
				return fmt.Errorf("%s: %w (deploy/local/chcluster.sh up, or make test-chcluster)", c, err)
			}
			continue
		}
		if err := dialAny(addrs); err != nil {
			return fmt.Errorf("%s unreachable at %s: %w", c, strings.Join(addrs, ","), err)
		}
	}
	return nil
}

func addresses(c Component) ([]string, error) {
	switch c {
	case Redis:
		var cfg redisconn.Config
		err := config.Load(&cfg)
		return cfg.Addrs, err
	case Postgres:
		var cfg pgpool.Config
		if err := config.Load(&cfg); err != nil {
			return nil, err
		}
		u, err := url.Parse(cfg.URL)
		if err != nil {
			return nil, fmt.Errorf("KURZ_POSTGRES_URL: %w", err)
		}
		return []string{u.Host}, nil
	case ClickHouse:
		var cfg chconn.Config
		err := config.Load(&cfg)
		return cfg.Addrs, err
	case ClickHouseCluster:
		var cfg chconn.Config
		if err := config.Load(&cfg); err != nil {
			return nil, err
		}
		if cfg.Cluster == "" {
			return nil, fmt.Errorf("KURZ_CLICKHOUSE_CLUSTER is not set (the cluster tests run on a cluster)")
		}
		return cfg.Addrs, nil
	}
	return nil, fmt.Errorf("unknown component %q", c)
}

// dialAll succeeds if every address accepts a TCP connection, and names
// the first that does not.
func dialAll(addrs []string) error {
	for _, a := range addrs {
		if err := dialAny([]string{a}); err != nil {
			return fmt.Errorf("unreachable at %s: %w", a, err)
		}
	}
	return nil
}

// dialAny succeeds if one address accepts a TCP connection: a cluster with
// one node down is still a stack, and the tests say what they need of it.
func dialAny(addrs []string) error {
	var last error = fmt.Errorf("no address")
	for _, a := range addrs {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", a)
		cancel()
		if err == nil {
			c.Close()
			return nil
		}
		last = err
	}
	return last
}
