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

// A node that would refuse a separate expiry with ASK (the key moved to
// another node right after the count) cannot refuse a visit: the count
// sets its own expiry, in one script, so the visit is counted once, on
// one node, and granted. Before, the count and the expiry were two
// commands; a slot move between them refused the expiry after the visit
// was counted, and the visit had to be refused (503) lest it count twice
// (a fault test's live reshard met it).
func TestAVisitsExpiryCannotBeSplitFromItsCount(t *testing.T) {
	dst := master(t, ":1\r\n")
	src := master(t, "-ASK 1234 "+dst.Addr()+"\r\n")
	srcC := redis.NewClient(&redis.Options{Addr: src.Addr(), MaxRetries: -1})
	dstC := redis.NewClient(&redis.Options{Addr: dst.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _, _ = srcC.Close(), dstC.Close() })
	h := &Handler{cfg: Config{VisitReplicas: 1}, visits: twoNodes{Client: srcC, src: srcC, dst: dstC}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	n, err := h.incr(ctx, "v:{abc}", 10, time.Now().Add(time.Hour).UnixMilli())
	if err != nil || n != 1 {
		t.Errorf("visit = %d, %v; want the first visit, counted", n, err)
	}
	if s, d := evals(src), evals(dst); s != 1 || d != 0 {
		t.Errorf("counted %d times on its node and %d where the key would move; want once, on its node", s, d)
	}
	for _, c := range append(src.Commands(), dst.Commands()...) {
		if cmd := strings.ToUpper(c[0]); cmd == "PEXPIREAT" || cmd == "PERSIST" {
			t.Errorf("%s sent apart from the count: a slot move in between could refuse it", cmd)
		}
	}
}
