package ratelimit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/testkit/resptest"
)

// echoKey answers EVALSHA with {1, <the number at the end of the first
// key>, <the number of args>}, so a reply given to the wrong caller shows.
func echoKey(args []string) string {
	if len(args) < 4 || args[0] != "evalsha" {
		return "-ERR unexpected " + strings.Join(args, " ") + "\r\n"
	}
	_, num, _ := strings.Cut(args[3], ":")
	return fmt.Sprintf("*3\r\n:1\r\n:%s\r\n:%d\r\n", num, len(args))
}

func testPipes(ioTimeout time.Duration) *pipes { return newPipes("", nil, time.Second, ioTimeout) }

func TestPipeRepliesReachTheirCallers(t *testing.T) {
	srv := resptest.Start(t, echoKey)
	p := testPipes(time.Second)
	defer p.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for i := range 400 {
		wg.Go(func() {
			vals, err := p.call(context.Background(), srv.Addr(), "sha", []string{"k:" + strconv.Itoa(i)}, []any{"", "check", "id", 4, int64(100)})
			if err != nil {
				errs <- err
				return
			}
			if len(vals) != 3 || vals[1] != int64(i) || vals[2] != 9 {
				errs <- fmt.Errorf("call %d got %v", i, vals)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := srv.Conns(); n != 1 {
		t.Errorf("%d connections to one node, want 1", n)
	}
}

// More calls queue while a batch is out than one round trip takes: they
// go in batches of at most maxPipeBatch, each answer still to its caller.
func TestPipeSplitsALongQueue(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	srv := resptest.Start(t, func(args []string) string {
		if args[3] == "k:-1" {
			close(arrived)
			<-release
		}
		return echoKey(args)
	})
	t.Cleanup(unblock) // before the server's cleanup waits for its handlers
	p := testPipes(10 * time.Second)
	defer p.Close()
	ctx := context.Background()
	first := make(chan error, 1)
	go func() {
		_, err := p.call(ctx, srv.Addr(), "sha", []string{"k:-1"}, nil)
		first <- err
	}()
	<-arrived // the flusher now waits for this call's reply
	np, _ := p.node(srv.Addr())
	const n = 3*maxPipeBatch + 7
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			vals, err := p.call(ctx, srv.Addr(), "sha", []string{"k:" + strconv.Itoa(i)}, nil)
			if err == nil && vals[1] != int64(i) {
				err = fmt.Errorf("call %d got %v", i, vals)
			}
			if err != nil {
				errs <- err
			}
		})
	}
	// Every call queued behind the first one's batch before it returns.
	deadline := time.Now().Add(5 * time.Second)
	for {
		np.mu.Lock()
		queued := len(np.queue)
		np.mu.Unlock()
		if queued == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d calls queued", queued, n)
		}
		runtime.Gosched()
	}
	unblock()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := <-first; err != nil {
		t.Error(err)
	}
	if got := len(srv.Commands()); got != n+1 {
		t.Errorf("the node ran %d commands, want %d", got, n+1)
	}
}

// Each master has its own connection and flusher: a node that holds its
// replies delays only the calls queued for it.
func TestPipeSlowNodeDelaysOnlyItsOwnCalls(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	slow := resptest.Start(t, func(args []string) string {
		<-release
		return echoKey(args)
	})
	healthy := resptest.Start(t, echoKey)
	t.Cleanup(unblock)
	p := testPipes(10 * time.Second)
	defer p.Close()
	ctx := context.Background()
	held := make(chan error, 1)
	go func() {
		_, err := p.call(ctx, slow.Addr(), "sha", []string{"k:1"}, nil)
		held <- err
	}()
	for i := range 50 {
		vals, err := p.call(ctx, healthy.Addr(), "sha", []string{"k:" + strconv.Itoa(i)}, nil)
		if err != nil || vals[1] != int64(i) {
			t.Fatalf("healthy node, call %d: %v, %v", i, vals, err)
		}
	}
	select {
	case err := <-held:
		t.Fatalf("the slow node's call returned before its reply: %v", err)
	default:
	}
	unblock()
	if err := <-held; err != nil {
		t.Errorf("slow node's call after its reply: %v", err)
	}
}

func TestPipeErrorRepliesKeepTheConnection(t *testing.T) {
	srv := resptest.Start(t, func(args []string) string {
		switch args[3] {
		case "moved":
			return "-MOVED 3999 127.0.0.1:7002\r\n"
		case "noscript":
			return "-NOSCRIPT No matching script. Please use EVAL.\r\n"
		case "bug":
			return "-ERR user_script:1: attempt to compare nil with number\r\n"
		}
		return echoKey(args)
	})
	p := testPipes(time.Second)
	defer p.Close()
	call := func(key string) ([]int64, error) {
		return p.call(context.Background(), srv.Addr(), "sha", []string{key}, nil)
	}
	for key, want := range map[string]error{"moved": errRedirect, "noscript": errNoScript} {
		if _, err := call(key); !errors.Is(err, want) || isScriptError(err) {
			t.Errorf("%s: err = %v, want %v for the cluster client", key, err, want)
		}
	}
	if _, err := call("bug"); !isScriptError(err) || errors.Is(err, errRedirect) || errors.Is(err, errNoScript) {
		t.Errorf("script bug: err = %v, want a script error", err)
	}
	if vals, err := call("k:7"); err != nil || vals[1] != 7 {
		t.Errorf("after error replies: %v, %v", vals, err)
	}
	if n := srv.Conns(); n != 1 {
		t.Errorf("%d connections, want 1: an error reply must not drop the connection", n)
	}
}

func TestPipeDropsAConnectionWhoseRepliesAreLate(t *testing.T) {
	srv := resptest.Start(t, func(args []string) string {
		if args[3] == "silent" {
			return ""
		}
		return echoKey(args)
	})
	p := testPipes(50 * time.Millisecond)
	defer p.Close()
	_, err := p.call(context.Background(), srv.Addr(), "sha", []string{"silent"}, nil)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("unanswered call: err = %v, want a timeout", err)
	}
	// The late reply could be taken for the next call's: a new connection.
	vals, err := p.call(context.Background(), srv.Addr(), "sha", []string{"k:3"}, nil)
	if err != nil || vals[1] != 3 {
		t.Fatalf("next call: %v, %v", vals, err)
	}
	if n := srv.Conns(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

func TestPipeCallerStopsWaitingAtItsDeadline(t *testing.T) {
	release := make(chan struct{})
	srv := resptest.Start(t, func(args []string) string {
		<-release
		return echoKey(args)
	})
	defer close(release)
	p := testPipes(5 * time.Second)
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := p.call(ctx, srv.Addr(), "sha", []string{"k:1"}, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the caller's deadline", err)
	}
}

// A caller that stopped waiting can still have its reply: the call ran on
// the node once it woke, and the engine gives back what a denied
// request's late script consumed (TestDenialsDuringAStallConsumeNothingOnRedis).
func TestPipeLateReplyReachesTheCallerThatStoppedWaiting(t *testing.T) {
	release := make(chan struct{})
	srv := resptest.Start(t, func(args []string) string {
		<-release
		return echoKey(args)
	})
	p := testPipes(5 * time.Second)
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := p.call(ctx, srv.Addr(), "sha", []string{"k:7"}, nil)
	late := lateReplyOf(err)
	if late == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the caller's deadline with the late reply", err)
	}
	close(release)
	if vals, ok := late.wait(); !ok || len(vals) != 3 || vals[1] != 7 {
		t.Errorf("late reply %v (ok %v), want {1, 7, 4}", vals, ok)
	}
}

// A caller already gone sends nothing: its script would consume units
// nobody is granted.
func TestPipeSendsNothingForACallerAlreadyGone(t *testing.T) {
	srv := resptest.Start(t, echoKey)
	p := testPipes(time.Second)
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.call(ctx, srv.Addr(), "sha", []string{"k:1"}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	// A live call after it is the first command the node sees.
	if vals, err := p.call(context.Background(), srv.Addr(), "sha", []string{"k:2"}, nil); err != nil || vals[1] != 2 {
		t.Fatalf("live call: %v, %v", vals, err)
	}
	if n := len(srv.Commands()); n != 1 {
		t.Errorf("the node ran %d commands, want 1", n)
	}
}

func TestPipeAuthenticates(t *testing.T) {
	var authed atomic.Bool
	srv := resptest.Start(t, func(args []string) string {
		if args[0] == "AUTH" {
			if args[1] != "s3cret" {
				return "-WRONGPASS invalid username-password pair\r\n"
			}
			authed.Store(true)
			return "+OK\r\n"
		}
		if !authed.Load() {
			return "-NOAUTH Authentication required.\r\n"
		}
		return echoKey(args)
	})
	bad := newPipes("wrong", nil, time.Second, time.Second)
	defer bad.Close()
	if _, err := bad.call(context.Background(), srv.Addr(), "sha", []string{"k:1"}, nil); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("wrong password: err = %v", err)
	}
	good := newPipes("s3cret", nil, time.Second, time.Second)
	defer good.Close()
	if vals, err := good.call(context.Background(), srv.Addr(), "sha", []string{"k:5"}, nil); err != nil || vals[1] != 5 {
		t.Errorf("right password: %v, %v", vals, err)
	}
}

func TestPipeForgottenNodeFailsQueuedCalls(t *testing.T) {
	srv := resptest.Start(t, echoKey)
	p := testPipes(time.Second)
	defer p.Close()
	if _, err := p.call(context.Background(), srv.Addr(), "sha", []string{"k:1"}, nil); err != nil {
		t.Fatal(err)
	}
	np, _ := p.node(srv.Addr())
	p.forget(func(string) bool { return false })
	// Once its flusher has stopped (a call it was still taking is
	// answered), a held nodePipe refuses at once.
	for {
		c := &pipeCall{cmd: appendEvalsha(nil, "sha", []string{"k:2"}, nil), done: make(chan struct{})}
		np.enqueue(c)
		<-c.done
		if errors.Is(c.err, errPipeStopped) {
			break
		}
		if c.err != nil {
			t.Fatalf("call on a forgotten node: %v", c.err)
		}
	}
	// A new call gets a new pipe.
	if vals, err := p.call(context.Background(), srv.Addr(), "sha", []string{"k:4"}, nil); err != nil || vals[1] != 4 {
		t.Errorf("after forget: %v, %v", vals, err)
	}
}

func TestAppendEvalshaIsRESP(t *testing.T) {
	got := string(appendEvalsha(nil, "abc", []string{"k1", "k2"}, []any{"", "check", 4, int64(-60000)}))
	want := "*9\r\n$7\r\nevalsha\r\n$3\r\nabc\r\n$1\r\n2\r\n$2\r\nk1\r\n$2\r\nk2\r\n$0\r\n\r\n$5\r\ncheck\r\n$1\r\n4\r\n$6\r\n-60000\r\n"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestReadIntsRefusesWhatTheScriptNeverAnswers(t *testing.T) {
	for _, reply := range []string{"$3\r\nabc\r\n", "*2\r\n:1\r\n$1\r\nx\r\n", "*x\r\n", "*1\r\n:12a\r\n", ":5\n", "*99999999\r\n"} {
		if _, err := readInts(bufio.NewReader(strings.NewReader(reply)), nil); err == nil || isReplyError(err) {
			t.Errorf("%q: err = %v, want a protocol error (the connection is dropped)", reply, err)
		}
	}
}

func TestReadIntsReadsEveryInteger(t *testing.T) {
	reply := "*6\r\n:0\r\n:-1\r\n:1764843123456\r\n:9223372036854775807\r\n:-9223372036854775808\r\n:42\r\n"
	want := []int64{0, -1, 1764843123456, math.MaxInt64, math.MinInt64, 42}
	got, err := readInts(bufio.NewReader(strings.NewReader(reply)), nil)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("readInts = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"*1\r\n:9223372036854775808\r\n", "*1\r\n:-9223372036854775809\r\n", "*1\r\n:\r\n", "*1\r\n:-\r\n", "*1\r\n:+1\r\n", "*-\r\n"} {
		if _, err := readInts(bufio.NewReader(strings.NewReader(bad)), nil); err == nil || isReplyError(err) {
			t.Errorf("%q: err = %v, want a protocol error", bad, err)
		}
	}
}

// A decision's reply is read into the caller's buffer without allocating:
// one string per line was 8 allocations per decision.
func TestReadIntsAllocatesNothing(t *testing.T) {
	reply := strings.Repeat("*7\r\n:1\r\n:1764843123456\r\n:99\r\n:60000\r\n:-1\r\n:0\r\n:0\r\n", 1000)
	r := bufio.NewReader(strings.NewReader(reply))
	buf := make([]int64, 0, 7)
	allocs := testing.AllocsPerRun(500, func() {
		if _, err := readInts(r, buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per reply, want 0", allocs)
	}
}

// With KURZ_REDIS_TLS the pipes speak TLS to the node (its certificate
// verified against KURZ_REDIS_TLS_CA_FILE), the password inside it; a
// plain connection to the same node gets no answer.
func TestPipeSpeaksTLS(t *testing.T) {
	srv, caFile := resptest.StartTLS(t, func(args []string) string {
		if args[0] == "AUTH" {
			return "+OK\r\n"
		}
		return echoKey(args)
	})
	tlsConfig, err := config.ClientTLS("REDIS_TLS", true, caFile)
	if err != nil {
		t.Fatal(err)
	}
	p := newPipes("s3cret", tlsConfig, time.Second, time.Second)
	defer p.Close()
	if vals, err := p.call(context.Background(), srv.Addr(), "sha", []string{"k:7"}, nil); err != nil || vals[1] != 7 {
		t.Fatalf("over TLS: %v, %v", vals, err)
	}
	if cmds := srv.Commands(); len(cmds) == 0 || !slices.Equal(cmds[0], []string{"AUTH", "s3cret"}) {
		t.Errorf("the node read %q, want AUTH s3cret first, inside TLS", cmds)
	}
	plain := newPipes("s3cret", nil, time.Second, 300*time.Millisecond)
	defer plain.Close()
	if _, err := plain.call(context.Background(), srv.Addr(), "sha", []string{"k:7"}, nil); err == nil {
		t.Error("a plain connection to a TLS node was answered")
	}
}

// A node that answers NOSCRIPT gets the script's source on the same
// pipeline (EVAL), which runs it and loads it there; the next EVALSHA is
// answered.
func TestPipeEvalLoadsTheScriptOnTheNode(t *testing.T) {
	var loaded atomic.Bool
	srv := resptest.Start(t, func(args []string) string {
		switch {
		case args[0] == "eval" && args[1] == "return {7}":
			loaded.Store(true)
			return "*1\r\n:7\r\n"
		case args[0] == "evalsha" && loaded.Load():
			return "*1\r\n:7\r\n"
		case args[0] == "evalsha":
			return "-NOSCRIPT No matching script. Please use EVAL.\r\n"
		}
		return "-ERR unexpected " + strings.Join(args, " ") + "\r\n"
	})
	p := testPipes(time.Second)
	defer p.Close()
	ctx := context.Background()
	if _, err := p.call(ctx, srv.Addr(), "sha", []string{"k"}, nil); !errors.Is(err, errNoScript) {
		t.Fatalf("EVALSHA before the script is loaded: %v, want errNoScript", err)
	}
	if vals, err := p.eval(ctx, srv.Addr(), "return {7}", []string{"k"}, nil); err != nil || !slices.Equal(vals, []int64{7}) {
		t.Fatalf("EVAL: %v, %v; want [7]", vals, err)
	}
	if vals, err := p.call(ctx, srv.Addr(), "sha", []string{"k"}, nil); err != nil || !slices.Equal(vals, []int64{7}) {
		t.Fatalf("EVALSHA after EVAL: %v, %v; want [7]", vals, err)
	}
}
