// Package redisconn builds the Redis Cluster client kurz services share.
package redisconn

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/config"
)

// Config locates the cluster. Timeouts are short on purpose: a slow Redis
// must not become every request's latency (callers that need a tighter bound,
// such as the limiter, set a context deadline per call).
type Config struct {
	// Addrs are seed nodes; the client discovers the rest of the cluster.
	Addrs []string `env:"REDIS_ADDRS" default:"127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005,127.0.0.1:7006"`
	// Password is the Redis password (AUTH).
	Password string `env:"REDIS_PASSWORD" default:""`
	// DialTimeout bounds connecting to a Redis node.
	DialTimeout time.Duration `env:"REDIS_DIAL_TIMEOUT" default:"1s"`
	// ReadTimeout is the socket read timeout (the limiter bounds each decision tighter).
	ReadTimeout time.Duration `env:"REDIS_READ_TIMEOUT" default:"100ms"`
	// WriteTimeout is the socket write timeout (the limiter bounds each decision tighter).
	WriteTimeout time.Duration `env:"REDIS_WRITE_TIMEOUT" default:"100ms"`
	// PoolSize is the connections per Redis Cluster node (1 to 10,000).
	PoolSize int `env:"REDIS_POOL_SIZE" default:"32"`
	// TLS connects to every node over TLS (TLS 1.2 or later, the node's
	// certificate verified for the address dialled): required to cross a
	// network others can read, as the password goes in the first command.
	TLS bool `env:"REDIS_TLS" default:"false"`
	// TLSCAFile is a PEM file of the certificates that sign the nodes'
	// (a private CA's); empty: the system's roots. Only with KURZ_REDIS_TLS.
	TLSCAFile string `env:"REDIS_TLS_CA_FILE" default:""`
}

// maxPoolSize bounds KURZ_REDIS_POOL_SIZE (connections per node).
const maxPoolSize = 10_000

// Check refuses settings the client cannot use, naming the variable:
// go-redis reads a negative pool size as a panic and a negative timeout
// as none, and an address without a port fails every dial (the limiter
// started "without Redis" on one, for good).
func (c Config) Check() error {
	var errs []error
	if len(c.Addrs) == 0 {
		errs = append(errs, errors.New("no addresses; set KURZ_REDIS_ADDRS"))
	}
	for _, a := range c.Addrs {
		if err := config.HostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("KURZ_REDIS_ADDRS: %w", err))
		}
	}
	if c.PoolSize < 1 || c.PoolSize > maxPoolSize {
		errs = append(errs, fmt.Errorf("KURZ_REDIS_POOL_SIZE=%d: want 1 to %d", c.PoolSize, maxPoolSize))
	}
	for _, t := range []struct {
		name string
		d    time.Duration
	}{{"KURZ_REDIS_DIAL_TIMEOUT", c.DialTimeout}, {"KURZ_REDIS_READ_TIMEOUT", c.ReadTimeout}, {"KURZ_REDIS_WRITE_TIMEOUT", c.WriteTimeout}} {
		if t.d <= 0 {
			errs = append(errs, fmt.Errorf("%s=%s: want more than 0", t.name, t.d))
		}
	}
	return errors.Join(errs...)
}

// New connects to the cluster and checks it is usable: every master answers
// and the cluster reports state ok. The error names the addresses and the
// variable to set.
func New(ctx context.Context, cfg Config, opts ...Option) (*redis.ClusterClient, error) {
	if err := cfg.Check(); err != nil {
		return nil, fmt.Errorf("redis cluster: %w", err)
	}
	installLogger()
	tlsConfig, err := config.ClientTLS("REDIS_TLS", cfg.TLS, cfg.TLSCAFile)
	if err != nil {
		return nil, fmt.Errorf("redis cluster: %w", err)
	}
	o := &options{cluster: &redis.ClusterOptions{
		TLSConfig:    tlsConfig,
		Addrs:        cfg.Addrs,
		Password:     cfg.Password,
		DialTimeout:  cfg.DialTimeout,
		ReadTimeout:  cfg.ReadTimeout,
		WriteTimeout: cfg.WriteTimeout,
		PoolSize:     cfg.PoolSize,
		// Context deadlines bound socket reads and writes, so a caller's
		// few-millisecond budget holds even when Redis stalls.
		ContextTimeoutEnabled: true,
		// Reads stay on masters: limiter state must be read where it is written.
		ReadOnly: false,
		// After a master failover the client sends that master's slots to
		// the dead node until it reloads the slot map: go-redis reloads it
		// on MOVED and ASK, which a dead node cannot answer, and otherwise
		// every 60 s. reloadOnRefusal reloads it as soon as a node refuses
		// connections; this bounds what a node that stopped answering
		// costs.
		ClusterStateReloadInterval: StateReloadInterval,
	}}
	for _, opt := range opts {
		opt(o)
	}
	c := redis.NewClusterClient(o.cluster)
	c.AddHook(reloadOnRefusal{c})
	for _, h := range o.hooks {
		c.AddHook(h)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		err := Check(ctx, c)
		if err == nil {
			return c, nil
		}
		// A node that answers slower than ReadTimeout (one busy moment, a
		// loaded machine) is asked again within the 5 s; one that refuses,
		// or an answer that is wrong, fails the start at once.
		if !timedOut(err) || ctx.Err() != nil {
			err = fmt.Errorf("redis cluster at %s unreachable (set KURZ_REDIS_ADDRS): %w", strings.Join(cfg.Addrs, ","), err)
			if o.unreachable != nil && outage(err) {
				o.unreachable(err)
				return c, nil
			}
			_ = c.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// StateReloadInterval is how old the client's view of which master serves
// which slots may get before it is reloaded, when it is next used: one
// CLUSTER SLOTS to one node per interval per busy client (an idle client
// sends none), against a failover's seconds of commands sent to a master
// that is gone.
const StateReloadInterval = 2 * time.Second

// reloadOnRefusal reloads the client's view of the cluster (in the
// background, coalesced) when a node refuses a connection: a master that
// died, whose slots a replica may already serve.
type reloadOnRefusal struct{ c *redis.ClusterClient }

func (h reloadOnRefusal) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnRefusal) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if errors.Is(err, syscall.ECONNREFUSED) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

func (h reloadOnRefusal) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if errors.Is(err, syscall.ECONNREFUSED) {
			h.c.ReloadState(ctx)
		}
		return err
	}
}

// errClusterState is Check's error for a cluster that answers but is not
// serving every slot (a master down, a failover under way).
var errClusterState = errors.New("cluster state is not ok")

// outage reports whether err is what an outage looks like (nothing
// answers, or a cluster that is not serving all its slots), as opposed to
// a wrong address or credentials: a Redis that is not a cluster, a
// password refused, a peer that does not speak RESP. StartUnreachable
// starts only through an outage; a misconfiguration fails the start.
func outage(err error) bool {
	var ne net.Error // a *net.OpError (refused, reset) is one too
	return errors.As(err, &ne) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, errClusterState) ||
		strings.Contains(err.Error(), "CLUSTERDOWN")
}

// timedOut reports whether err is a network timeout: the node may only be
// slow.
func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Check pings every master and verifies the cluster state; it is the Redis
// readiness check.
func Check(ctx context.Context, c *redis.ClusterClient) error {
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return fmt.Errorf("cluster info: %w", err)
	}
	if !strings.Contains(info, "cluster_state:ok") {
		return errClusterState
	}
	return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		if err := m.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("ping %s: %w", m.Options().Addr, err)
		}
		return nil
	})
}

// Option adjusts the client for one use.
type Option func(*options)

type options struct {
	cluster     *redis.ClusterOptions
	hooks       []redis.Hook
	unreachable func(error)
}

// StartUnreachable makes New return the client of a cluster it cannot
// reach, after telling report why, instead of an error: for a service that
// has an answer without Redis (the limiter's failure modes), so that a
// replica started during an outage serves. The client connects once the
// cluster answers. Only an outage starts so (outage): a Redis that is no
// cluster, or that refuses the password, still fails the start.
func StartUnreachable(report func(error)) Option {
	return func(o *options) { o.unreachable = report }
}

// NoRetries makes a client that never sends a command a second time once
// it may have run: not after a timeout nor a broken connection, pipelines
// included. Use it for writes that are not idempotent (XADD with an
// automatic ID, INCR of a visit): a retry after a timeout whose write in
// fact succeeded would append the entry twice. A command a node refused
// with MOVED or ASK did not run: the client still follows the redirect, so
// the write lands while the cluster moves slots between nodes. Nor did one
// refused with TRYAGAIN (its keys split between two nodes while their slot
// moves): it is sent again after a short wait (retryTryAgain), as long as
// ctx's deadline allows.
func NoRetries(o *options) {
	// The node clients never retry; the cluster client's attempts
	// (MaxRedirects, default 3) resend only what never ran, because every
	// command is marked NoRetry on its way in.
	o.cluster.MaxRetries = -1
	o.hooks = append(o.hooks, sendOnce{})
}

// sendOnce marks every command, single or pipelined, NoRetry before the
// cluster client sees it: go-redis then resends none after a network error
// or a timeout, and follows MOVED and ASK whatever the mark. It resends
// only a single command refused with TRYAGAIN (retryTryAgain), which go-redis
// does not for a NoRetry command: a pipeline's other commands ran.
type sendOnce struct{}

func (sendOnce) DialHook(next redis.DialHook) redis.DialHook { return next }

func (sendOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return retryTryAgain(ctx, func() error { return next(ctx, once{cmd}) })
	}
}

// TRYAGAIN's waits: the first, the longest, and how long a command may be
// retried when its ctx has no deadline.
const (
	tryAgainFirstWait  = time.Millisecond
	tryAgainMaxWait    = 50 * time.Millisecond
	tryAgainNoDeadline = time.Second
)

// retryTryAgain runs send, and again after a wait (1 ms, doubling up to
// 50 ms) while it fails with TRYAGAIN and the next attempt can start before
// ctx's deadline (without one, within tryAgainNoDeadline). A node answers
// TRYAGAIN to a command on several keys whose slot is moving and only some
// of whose keys it holds, before running it: resent, it can neither run
// twice nor consume twice, and it runs once the slot's keys are together
// again (redis-cli --cluster reshard moves a slot's keys in batches; every
// multi-key command of a key set split between two batches gets TRYAGAIN
// meanwhile). Unretried, each such limiter decision fell to its rule's
// failure mode. It returns the last error: TRYAGAIN when the deadline
// comes first, so the cause is not hidden behind ctx's.
func retryTryAgain(ctx context.Context, send func() error) error {
	err := send()
	if !redis.IsTryAgainError(err) {
		return err // nearly always: the hot path reads no clock
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(tryAgainNoDeadline)
	}
	for wait := tryAgainFirstWait; ; wait = min(2*wait, tryAgainMaxWait) {
		if time.Now().Add(wait).After(deadline) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		if err = send(); !redis.IsTryAgainError(err) {
			return err
		}
	}
}

func (sendOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		marked := make([]redis.Cmder, len(cmds))
		for i, c := range cmds {
			marked[i] = once{c}
		}
		return next(ctx, marked)
	}
}

// once is a command go-redis must not resend; its reply lands in the
// command it wraps.
type once struct{ redis.Cmder }

func (once) NoRetry() bool { return true }

// Dialer makes the client open its connections with dial (a proxy's, or a
// test's that breaks them).
func Dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) Option {
	return func(o *options) { o.cluster.Dialer = dial }
}

// NodeDialer dials a node with d, over TLS when tlsConfig is not nil (a
// client's Options().TLSConfig): for connections of a client's own to the
// nodes (the limiter's pipelines, the redirect's click writers).
func NodeDialer(d *net.Dialer, tlsConfig *tls.Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if tlsConfig == nil {
		return d.DialContext
	}
	return (&tls.Dialer{NetDialer: d, Config: tlsConfig}).DialContext
}

// SocketTimeouts sets the read and write timeouts of each socket operation,
// for a client whose calls carry a longer budget than the default's.
func SocketTimeouts(d time.Duration) Option {
	return func(o *options) { o.cluster.ReadTimeout, o.cluster.WriteTimeout = d, d }
}
