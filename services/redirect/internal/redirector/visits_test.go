package redirector

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/testkit/resptest"
)

// twoNodes is a cluster of two fake masters whose slot map puts every key
// on src.
type twoNodes struct {
	*redis.Client
	src, dst *redis.Client
}

func (n twoNodes) MasterForKey(context.Context, string) (*redis.Client, error) { return n.src, nil }

func (n twoNodes) ForEachMaster(ctx context.Context, fn func(context.Context, *redis.Client) error) error {
	for _, c := range []*redis.Client{n.src, n.dst} {
		if err := fn(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// master is a fake master's visit counter: it answers EVAL with 1, and
// the expiry with expiry.
func master(t *testing.T, expiry string) *resptest.Node {
	return resptest.Start(t, func(args []string) string {
		switch strings.ToUpper(args[0]) {
		case "EVAL":
			return ":1\r\n"
		case "PEXPIREAT", "PERSIST":
			return expiry
		case "WAIT":
			return ":1\r\n"
		case "HELLO":
			return "-ERR unknown command 'HELLO'\r\n"
		}
		return "+OK\r\n"
	})
}

// evals is how many counts node ran.
func evals(node *resptest.Node) int {
	n := 0
	for _, c := range node.Commands() {
		if strings.EqualFold(c[0], "EVAL") {
			n++
		}
	}
	return n
}

// A visit counted on its key's node, whose expiry the node then refused
// with ASK (the key moved to another node between the two commands), is
// not counted again on that node: it counted on the first. Before, the
// round trip's ASK sent the count to the other node too: two visits
// counted for one.
func TestAVisitCountedBeforeItsKeyMovedIsNotCountedAgain(t *testing.T) {
	dst := master(t, ":1\r\n")
	src := master(t, "-ASK 1234 "+dst.Addr()+"\r\n")
	srcC := redis.NewClient(&redis.Options{Addr: src.Addr(), MaxRetries: -1})
	dstC := redis.NewClient(&redis.Options{Addr: dst.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _, _ = srcC.Close(), dstC.Close() })
	h := &Handler{cfg: Config{VisitReplicas: 1}, visits: twoNodes{Client: srcC, src: srcC, dst: dstC}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	_, err := h.incr(ctx, "v:{abc}", 10, time.Now().Add(time.Hour).UnixMilli())
	if n, m := evals(src), evals(dst); n+m != 1 {
		t.Errorf("one visit counted %d times (%d on its node, %d where the key moved), want once", n+m, n, m)
	}
	if err == nil {
		t.Error("a visit whose expiry was not set: no error")
	}
}
