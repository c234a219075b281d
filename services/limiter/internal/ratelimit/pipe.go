package ratelimit

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"time"

	"kurz.dev/pkg/redisconn"
	"kurz.dev/pkg/resp"
)

// pipes batches decision scripts per Redis master: one connection and one
// flusher goroutine per node, which writes everything queued for the node
// in one write, reads the replies in order, and starts over with what
// queued meanwhile. Batches grow with the load by themselves and nothing
// waits for a timer.
//
// It does one thing, EVALSHA of the decision script with a reply of
// integers, and leaves everything else to go-redis: an error reply other
// than the script's own (NOSCRIPT as errNoScript; MOVED, ASK, TRYAGAIN,
// LOADING, ... as errRedirect) is returned and the engine runs the call
// again through the cluster client, which loads the script, follows
// redirects, waits out TRYAGAIN (redisconn.NoRetries) and reloads its
// topology. It replaced go-redis's auto-pipeliner on the decision path,
// whose per-batch bookkeeping (a goroutine per node per batch, the batch
// executor's goroutine id read from runtime.Stack) cost more than the
// batches saved at the spread loads the limiter sees.
type pipes struct {
	password    string
	dialTimeout time.Duration
	// ioTimeout bounds each batch's write and read: past it, the
	// connection is dropped (its replies can no longer be matched) and the
	// batch's calls fail.
	ioTimeout time.Duration
	dial      func(ctx context.Context, network, addr string) (net.Conn, error)

	mu     sync.Mutex
	byNode map[string]*nodePipe
	closed bool
}

// newPipes dials the nodes with TLS when tlsConfig is not nil (the
// cluster client's: KURZ_REDIS_TLS).
func newPipes(password string, tlsConfig *tls.Config, dialTimeout, ioTimeout time.Duration) *pipes {
	dial := redisconn.NodeDialer(&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}, tlsConfig)
	return &pipes{password: password, dialTimeout: dialTimeout, ioTimeout: ioTimeout, dial: dial, byNode: map[string]*nodePipe{}}
}

// pipeCall is one queued script call: its encoded command, then its reply.
type pipeCall struct {
	cmd  []byte
	vals []int64
	err  error
	done chan struct{}
}

// errPipeStopped fails calls queued on a node that is no longer a master
// (or after Close).
var errPipeStopped = errors.New("redis: node pipeline stopped")

// errRedirect wraps a Redis error reply that the cluster client must
// handle (a redirect, a node not ready), errNoScript a node's reply that
// it does not hold the script (the cluster client's EVAL loads it).
var (
	errRedirect = errors.New("redis: not answered by the node")
	errNoScript = errors.New("redis: script not loaded on the node")
)

// scriptError is the decision script's own error reply: a bug, not an
// outage (isScriptError finds it through RedisError).
type scriptError string

func (e scriptError) Error() string { return string(e) }
func (scriptError) RedisError()     {}

// call queues the script with keys and args on node and waits for its
// reply until ctx is done. A call abandoned at its deadline still runs:
// its error is then a *lateReply, through which the reply can still be
// read once it arrives.
func (p *pipes) call(ctx context.Context, node, sha string, keys []string, args []any) ([]int64, error) {
	return p.send(ctx, node, "evalsha", sha, keys, args)
}

// eval is call with the script's source (EVAL), which also loads it on
// node: what a node that answered NOSCRIPT gets (restarted, or a replica
// promoted by a failover: the script cache is not replicated). The slot
// map names the node; the cluster client, which could load the script
// too, may still route the slot to the dead master for seconds after a
// failover (its own view of the cluster reloads in its own time), and
// every decision of the slot fell back meanwhile.
func (p *pipes) eval(ctx context.Context, node, src string, keys []string, args []any) ([]int64, error) {
	return p.send(ctx, node, "eval", src, keys, args)
}

func (p *pipes) send(ctx context.Context, node, verb, script string, keys []string, args []any) ([]int64, error) {
	if err := ctx.Err(); err != nil {
		// Nobody would read the answer, and a "check" would consume.
		return nil, err
	}
	np, err := p.node(node)
	if err != nil {
		return nil, err
	}
	c := &pipeCall{cmd: appendScript(make([]byte, 0, 128+len(script)+32*len(keys)+8*len(args)), verb, script, keys, args), done: make(chan struct{})}
	np.enqueue(c)
	select {
	case <-c.done:
		return c.vals, c.err
	case <-ctx.Done():
		return nil, &lateReply{err: ctx.Err(), c: c}
	}
}

// lateReply is the error of a call whose caller stopped waiting while the
// call was queued or written: the script may still run on Redis, and the
// flusher still reads its reply. It is ctx's error (errors.Is finds
// context.DeadlineExceeded or context.Canceled through it), and wait
// hands over the reply that came after all.
type lateReply struct {
	err error
	c   *pipeCall
}

func (l *lateReply) Error() string { return l.err.Error() }
func (l *lateReply) Unwrap() error { return l.err }

// wait blocks until the call is answered or failed, which the flusher
// does for every call it was given within its I/O timeout (or at once,
// when the pipeline stops), and returns the reply, ok false when the call
// failed (not run, or its reply was lost with the connection).
func (l *lateReply) wait() (vals []int64, ok bool) {
	<-l.c.done
	return l.c.vals, l.c.err == nil
}

// lateReplyOf returns the late reply err carries, or nil.
func lateReplyOf(err error) *lateReply {
	var l *lateReply
	if errors.As(err, &l) {
		return l
	}
	return nil
}

func (p *pipes) node(addr string) (*nodePipe, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("redis: pipelines closed")
	}
	np := p.byNode[addr]
	if np == nil {
		np = &nodePipe{p: p, addr: addr, wake: make(chan struct{}, 1), stop: make(chan struct{})}
		p.byNode[addr] = np
		go np.run()
	}
	return np, nil
}

// forget stops the pipes of nodes keep rejects (no longer masters).
func (p *pipes) forget(keep func(node string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, np := range p.byNode {
		if !keep(addr) {
			close(np.stop)
			delete(p.byNode, addr)
		}
	}
}

// Close stops every flusher; calls still queued fail.
func (p *pipes) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for addr, np := range p.byNode {
		close(np.stop)
		delete(p.byNode, addr)
	}
}

// maxPipeBatch bounds the calls of one round trip (~100 KiB of commands,
// ~30 KiB of replies).
const maxPipeBatch = 512

// nodePipe is one node's queue, connection and flusher.
type nodePipe struct {
	p    *pipes
	addr string
	wake chan struct{}
	stop chan struct{}

	mu      sync.Mutex
	queue   []*pipeCall
	stopped bool

	// Owned by the flusher.
	conn  net.Conn
	r     *bufio.Reader
	w     *bufio.Writer
	spare []*pipeCall
}

func (n *nodePipe) enqueue(c *pipeCall) {
	n.mu.Lock()
	if n.stopped {
		n.mu.Unlock()
		c.err = errPipeStopped
		close(c.done)
		return
	}
	n.queue = append(n.queue, c)
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

func (n *nodePipe) run() {
	defer n.drop()
	for {
		select {
		case <-n.stop:
			n.failQueued(errPipeStopped)
			return
		case <-n.wake:
		}
		for {
			// Let the goroutines that are ready to run queue theirs
			// first: measured beside the stack at 32 callers over
			// 100,000 keys, 11.7-12.1k decisions/s with the yield against
			// 10.2-11.2k without (smaller batches, more Redis CPU per
			// decision), and no timer is involved.
			runtime.Gosched()
			n.mu.Lock()
			batch := n.queue
			n.queue = n.spare[:0]
			if len(batch) > maxPipeBatch {
				// The rest waits for the next round trip: the replies of
				// a batch are read only once all of it is written, so a
				// batch must not outgrow what the sockets buffer.
				n.queue = append(n.queue, batch[maxPipeBatch:]...)
				batch = batch[:maxPipeBatch]
			}
			n.mu.Unlock()
			if len(batch) == 0 {
				n.spare = batch
				break
			}
			n.exec(batch)
			clear(batch[:cap(batch)])
			n.spare = batch[:0]
		}
	}
}

func (n *nodePipe) failQueued(err error) {
	n.mu.Lock()
	batch := n.queue
	n.queue, n.stopped = nil, true
	n.mu.Unlock()
	for _, c := range batch {
		c.err = err
		close(c.done)
	}
}

// exec writes batch and reads its replies; on any I/O failure the
// connection goes and every call not yet answered fails with the error.
func (n *nodePipe) exec(batch []*pipeCall) {
	answered := 0
	err := n.roundTrip(batch, &answered)
	if err != nil {
		n.drop()
		for _, c := range batch[answered:] {
			c.err = err
			close(c.done)
		}
	}
}

func (n *nodePipe) roundTrip(batch []*pipeCall, answered *int) error {
	if n.conn == nil {
		if err := n.connect(); err != nil {
			return err
		}
	}
	if err := n.conn.SetDeadline(time.Now().Add(n.p.ioTimeout)); err != nil {
		return err
	}
	for _, c := range batch {
		if _, err := n.w.Write(c.cmd); err != nil {
			return err
		}
	}
	if err := n.w.Flush(); err != nil {
		return err
	}
	for _, c := range batch {
		vals, err := readInts(n.r, c.vals)
		if err != nil && !isReplyError(err) {
			return err
		}
		c.vals, c.err = vals, err
		close(c.done)
		*answered++
	}
	return nil
}

func (n *nodePipe) connect() error {
	ctx, cancel := context.WithTimeout(context.Background(), n.p.dialTimeout)
	defer cancel()
	conn, err := n.p.dial(ctx, "tcp", n.addr)
	if err != nil {
		return err
	}
	n.conn, n.r, n.w = conn, bufio.NewReaderSize(conn, 16<<10), bufio.NewWriterSize(conn, 16<<10)
	if n.p.password == "" {
		return nil
	}
	if err := conn.SetDeadline(time.Now().Add(n.p.dialTimeout)); err != nil {
		return err
	}
	return resp.Auth(conn, n.r, "", n.p.password)
}

func (n *nodePipe) drop() {
	if n.conn != nil {
		_ = n.conn.Close()
		n.conn, n.r, n.w = nil, nil, nil
	}
}

// replyError is a Redis error reply read off the connection: the
// connection stays usable.
type replyError struct{ err error }

func (e replyError) Error() string { return e.err.Error() }
func (e replyError) Unwrap() error { return e.err }

func isReplyError(err error) bool {
	var r replyError
	return errors.As(err, &r)
}

// readInts reads one reply, an array of integers (the decision script's),
// into buf's storage. An error reply comes back as a replyError: the
// script's own errors (ERR ... from the script) as a scriptError, anything
// else as errNoScript (NOSCRIPT) or errRedirect (MOVED, ASK, ...).
func readInts(r *bufio.Reader, buf []int64) ([]int64, error) {
	b, err := resp.ReadLine(r)
	if err != nil {
		return nil, err
	}
	switch {
	case b[0] == '-':
		msg := string(b[1:])
		switch code, _, _ := strings.Cut(msg, " "); {
		case code == "NOSCRIPT":
			return nil, replyError{fmt.Errorf("%w: %s", errNoScript, msg)}
		case resp.NotServed(msg):
			return nil, replyError{fmt.Errorf("%w: %s", errRedirect, msg)}
		}
		return nil, replyError{scriptError(msg)}
	case b[0] == '*':
	default:
		return nil, fmt.Errorf("redis: unexpected reply %.40q", b)
	}
	count, ok := resp.ParseInt(b[1:])
	if !ok || count < 0 || count > 1<<16 {
		return nil, fmt.Errorf("redis: bad array header %.40q", b)
	}
	vals := buf[:0]
	for range count {
		b, err := resp.ReadLine(r)
		if err != nil {
			return nil, err
		}
		if b[0] != ':' {
			return nil, fmt.Errorf("redis: unexpected array element %.40q", b)
		}
		v, ok := resp.ParseInt(b[1:])
		if !ok {
			return nil, fmt.Errorf("redis: bad integer %.40q", b)
		}
		vals = append(vals, v)
	}
	return vals, nil
}

// appendEvalsha encodes EVALSHA sha len(keys) keys... args... in RESP.
func appendEvalsha(b []byte, sha string, keys []string, args []any) []byte {
	return appendScript(b, "evalsha", sha, keys, args)
}

// appendScript encodes verb (EVALSHA or EVAL) script len(keys) keys...
// args... in RESP.
func appendScript(b []byte, verb, script string, keys []string, args []any) []byte {
	b = resp.AppendArray(b, 3+len(keys)+len(args))
	b = resp.AppendBulk(b, verb)
	b = resp.AppendBulk(b, script)
	b = resp.AppendBulkInt(b, int64(len(keys)))
	for _, k := range keys {
		b = resp.AppendBulk(b, k)
	}
	for _, a := range args {
		switch v := a.(type) {
		case string:
			b = resp.AppendBulk(b, v)
		case int:
			b = resp.AppendBulkInt(b, int64(v))
		case int64:
			b = resp.AppendBulkInt(b, v)
		default:
			b = resp.AppendBulk(b, fmt.Sprint(v))
		}
	}
	return b
}
