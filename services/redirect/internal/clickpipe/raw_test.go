package clickpipe

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"kurz.dev/pkg/clickevent"
	kurzconfig "kurz.dev/pkg/config"
	"kurz.dev/pkg/testkit/metrictest"
	"kurz.dev/pkg/testkit/resptest"
	"kurz.dev/pkg/testkit/servertest"
)

// newFakeNode starts a Redis node that accepts AUTH and answers the n-th
// XADD it receives (counting from 0 over all connections) with reply(n):
// raw RESP, or resptest.HangUp to close the connection instead.
func newFakeNode(t *testing.T, reply func(n int) string) *resptest.Node {
	t.Helper()
	var xadds atomic.Int64
	return resptest.Start(t, func(args []string) string {
		if strings.EqualFold(args[0], "AUTH") {
			return "+OK\r\n"
		}
		return reply(int(xadds.Add(1) - 1))
	})
}

// routeTo routes every stream key to node.
func routeTo(node *resptest.Node, password string) Route {
	return func(context.Context, string) (Node, error) {
		return Node{Addr: node.Addr(), Password: password}, nil
	}
}

func entryID(n int) string {
	id := fmt.Sprintf("1790000000000-%d", n)
	return fmt.Sprintf("$%d\r\n%s\r\n", len(id), id)
}

func routed(node *resptest.Node, password string) Config {
	cfg := config()
	cfg.Batch = 4
	cfg.Route = routeTo(node, password)
	return cfg
}

// With a route, a batch goes to the stream's node over the writer's own
// connection (AUTH first when there is a password), each event one XADD
// with go-redis's arguments; the cluster client's pipeline is not used.
func TestRoutedBatchesUseTheWritersConnection(t *testing.T) {
	node := newFakeNode(t, entryID)
	rdb := &fakeStreams{}
	p, reader := start(t, routed(node, "s3cret"), rdb)
	for i := range 8 {
		p.Record(event(i))
	}
	awaitCounter(t, reader, 8, written)
	cmds, conns := node.Commands(), node.Conns()
	if conns != 1 || len(cmds) != 9 || !slices.Equal(cmds[0], []string{"AUTH", "s3cret"}) {
		t.Fatalf("node got %d connections and commands %q, want one connection: AUTH, then 8 XADDs", conns, cmds)
	}
	key := clickevent.StreamKeys(1)[0]
	for i, cmd := range cmds[1:] {
		want := append([]string{"XADD", key, "MAXLEN", "~", "5000", "*"}, event(i).Values()...)
		if !slices.Equal(cmd, want) {
			t.Errorf("XADD %d: %q, want %q", i, cmd, want)
		}
	}
	if got := rdb.events(); got != 0 {
		t.Errorf("the cluster client's pipeline sent %d events, want 0", got)
	}
}

// Events the node redirects (MOVED, ASK, TRYAGAIN, ...) were not written
// there: the cluster client's pipeline sends them, and they count as
// written.
func TestRedirectedEventsGoThroughTheClusterClient(t *testing.T) {
	node := newFakeNode(t, func(n int) string {
		switch n {
		case 1:
			return "-MOVED 3999 127.0.0.1:7002\r\n"
		case 3:
			return "-TRYAGAIN Multiple keys request during rehashing of slot\r\n"
		}
		return entryID(n)
	})
	rdb := &fakeStreams{}
	p, reader := start(t, routed(node, ""), rdb)
	for i := range 4 {
		p.Record(event(i))
	}
	awaitCounter(t, reader, 4, written)
	var ids []string
	for _, b := range rdb.sent() {
		for _, a := range b {
			ids = append(ids, a.Values.([]any)[3].(string))
		}
	}
	if want := []string{"id-1", "id-3"}; !slices.Equal(ids, want) {
		t.Errorf("the cluster client sent %v, want %v", ids, want)
	}
	if got := metrictest.Counter(t, reader, dropped, "reason", "redis"); got != 0 {
		t.Errorf("dropped %d, want 0", got)
	}
}

// An error reply of the node's own (OOM) loses that event, counted; the
// rest of the batch is written.
func TestErrorRepliesAreCountedAsDropped(t *testing.T) {
	node := newFakeNode(t, func(n int) string {
		if n == 2 {
			return "-OOM command not allowed when used memory > 'maxmemory'.\r\n"
		}
		return entryID(n)
	})
	rdb := &fakeStreams{}
	p, reader := start(t, routed(node, ""), rdb)
	for i := range 4 {
		p.Record(event(i))
	}
	awaitCounter(t, reader, 1, dropped, "reason", "redis")
	if got := metrictest.Counter(t, reader, written); got != 3 {
		t.Errorf("written %d, want 3", got)
	}
	if got := rdb.events(); got != 0 {
		t.Errorf("the cluster client sent %d events, want 0 (an OOM is not a redirect)", got)
	}
}

// A connection lost in the middle of a batch: the events it answered are
// written, the others lost and counted (they may have been appended: sent
// again, they could be twice), and the next batch connects anew.
func TestALostConnectionLosesOnlyTheUnansweredEvents(t *testing.T) {
	node := newFakeNode(t, func(n int) string {
		if n == 2 {
			return resptest.HangUp // before answering XADD 2
		}
		return entryID(n)
	})
	rdb := &fakeStreams{}
	p, reader := start(t, routed(node, ""), rdb)
	for i := range 4 {
		p.Record(event(i))
	}
	awaitCounter(t, reader, 2, dropped, "reason", "redis")
	if got := metrictest.Counter(t, reader, written); got != 2 {
		t.Errorf("written %d, want 2", got)
	}
	for i := 4; i < 8; i++ {
		p.Record(event(i))
	}
	awaitCounter(t, reader, 6, written)
	if conns := node.Conns(); conns != 2 {
		t.Errorf("%d connections, want 2 (one anew after the loss)", conns)
	}
	if got := rdb.events(); got != 0 {
		t.Errorf("the cluster client sent %d events, want 0", got)
	}
}

// A node that cannot be reached got nothing: the cluster client's
// pipeline sends the batch.
func TestAnUnreachableNodeLeavesTheBatchToTheClusterClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	cfg := config()
	cfg.Batch = 4
	cfg.Route = func(context.Context, string) (Node, error) { return Node{Addr: addr}, nil }
	rdb := &fakeStreams{}
	p, reader := start(t, cfg, rdb)
	for i := range 4 {
		p.Record(event(i))
	}
	awaitCounter(t, reader, 4, written)
	if got := rdb.events(); got != 4 {
		t.Errorf("the cluster client sent %d events, want 4", got)
	}
}

// Close's deadline cuts a routed batch in flight too.
func TestCloseCutsARoutedBatch(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	node := newFakeNode(t, func(n int) string {
		close(entered)
		<-release // never answers while the test runs
		return resptest.HangUp
	})
	t.Cleanup(func() { close(release) })
	cfg := routed(node, "")
	cfg.Batch = 1
	p, reader := start(t, cfg, &fakeStreams{})
	p.Record(event(0))
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Close(ctx); err == nil || !strings.Contains(err.Error(), "flush cut short") {
		t.Fatalf("Close with an ended context: %v, want the flush cut short", err)
	}
	if got := metrictest.Counter(t, reader, dropped, "reason", "redis"); got != 1 {
		t.Errorf("dropped redis %d, want 1 (the cut write)", got)
	}
}

// With KURZ_REDIS_TLS (the route's node carries the cluster client's TLS
// configuration) the writer's own connection speaks TLS, AUTH inside it.
func TestRoutedBatchesSpeakTLS(t *testing.T) {
	var xadds atomic.Int64
	node, caFile := resptest.StartTLS(t, func(args []string) string {
		if strings.EqualFold(args[0], "AUTH") {
			return "+OK\r\n"
		}
		return entryID(int(xadds.Add(1) - 1))
	})
	tlsConfig, err := kurzconfig.ClientTLS("REDIS_TLS", true, caFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := routed(node, "s3cret")
	cfg.Route = func(context.Context, string) (Node, error) {
		return Node{Addr: node.Addr(), Password: "s3cret", TLS: tlsConfig}, nil
	}
	rdb := &fakeStreams{}
	p, reader := start(t, cfg, rdb)
	for i := range 4 {
		p.Record(event(i))
	}
	awaitCounter(t, reader, 4, written)
	if cmds := node.Commands(); len(cmds) != 5 || !slices.Equal(cmds[0], []string{"AUTH", "s3cret"}) || rdb.events() != 0 {
		t.Errorf("the TLS node read %q and the cluster client sent %d events, want AUTH then 4 XADDs over TLS, none by the client", cmds, rdb.events())
	}
}

// A writer's connection that fails tells NodeFailed, which reloads the
// cluster client's slot map: its node may be a master a failover
// replaced. A node that hangs up, one that cannot be reached: each batch
// says so; one that answers says nothing.
func TestAFailedConnectionReloadsTheSlotMap(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	hangsUp := newFakeNode(t, func(n int) string {
		if n == 0 {
			return resptest.HangUp
		}
		return entryID(n)
	})
	for _, c := range []struct {
		name string
		addr string
		want int64
	}{
		{"hangs up", hangsUp.Addr(), 1},
		{"unreachable", gone, 1},
		{"answers", newFakeNode(t, entryID).Addr(), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var failed atomic.Int64
			cfg := config()
			cfg.Batch = 4
			cfg.Route = func(context.Context, string) (Node, error) { return Node{Addr: c.addr}, nil }
			cfg.NodeFailed = func() { failed.Add(1) }
			p, reader := start(t, cfg, &fakeStreams{})
			for i := range 4 {
				p.Record(event(i))
			}
			// Written by the node or by the cluster client, or lost: the
			// batch is done, and NodeFailed told before it was counted.
			done := func() int64 {
				return metrictest.Counter(t, reader, written) + metrictest.Counter(t, reader, dropped, "reason", "redis")
			}
			if !servertest.Eventually(10*time.Second, func() bool { return done() >= 4 }) {
				t.Fatalf("%d of 4 events written or dropped", done())
			}
			if got := failed.Load(); got != c.want {
				t.Errorf("NodeFailed told %d times, want %d", got, c.want)
			}
		})
	}
}
