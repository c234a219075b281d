// Command redirectpeers measures kurz's redirect service beside two peers,
// one viral code each, with the same HTTP client and callers:
//
//   - net/http (-fixed302): the least a redirect costs, a handler answering
//     a fixed 302 in a process of its own (tools/fixed302);
//   - the design notes' Node prototype (-node): node:http, a Redis GET of
//     the code, a fire-and-forget XADD of the click, 302
//     (deploy/bench/node-prototype), on a standalone Redis (-node-redis,
//     where this command writes the code);
//   - kurz (-kurz): the redirect service, the code written to its link cache
//     on the Redis Cluster (KURZ_REDIS_* variables) as the shortener does.
//
// Each runs closed loop (-c callers, -d per measurement), in turns, -rounds
// times. Each measurement charges the server process (-kurz-pid, ...) the
// CPU time it used meanwhile (/proc), and the whole click path (-kurz-path-
// pids, -node-path-pids: the processes that carry a click to storage, the
// server included) likewise. The report, markdown tables and kurz's ratios
// to each peer, goes to stdout; each run's line to stderr. An empty address
// skips its server. deploy/bench/peers.sh starts the peers and runs this.
//
//	go run ./tools/redirectpeers -fixed302 127.0.0.1:9307 -fixed302-pid 123 \
//		-node 127.0.0.1:9308 -node-pid 124 -node-redis 127.0.0.1:9309 -kurz-pid 99 -d 3s -rounds 1
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/config"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/tools/loadgen"
)

// The viral link: an ID far above any sequence a real shortener reaches
// here, and apart from redirectload's.
const (
	viralID  = 3_450_000_000_000
	viralURL = "https://example.com/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "redirectpeers:", err)
		os.Exit(1)
	}
}

func run() error {
	kurzAddr := flag.String("kurz", "127.0.0.1:8787", "kurz redirect service address; empty = skip")
	kurzPID := flag.Int("kurz-pid", 0, "kurz redirect process ID (0 = no CPU figures)")
	kurzPath := flag.String("kurz-path-pids", "", "process IDs of kurz's click path besides the redirect (analytics, limiter, Redis, ClickHouse), comma-separated")
	kurzConsumers := flag.String("kurz-consumer-pids", "", "process IDs of kurz's click consumers (analytics), comma-separated: kurz is measured a second time with them stopped (SIGSTOP) during the run, as the peers consume nothing, and waited for after it")
	fixedAddr := flag.String("fixed302", "", "fixed302 address; empty = skip")
	fixedPID := flag.Int("fixed302-pid", 0, "fixed302 process ID")
	nodeAddr := flag.String("node", "", "Node prototype address; empty = skip")
	nodePID := flag.Int("node-pid", 0, "Node prototype process ID")
	nodeRedis := flag.String("node-redis", "127.0.0.1:9309", "the Node prototype's Redis, where its link is written")
	nodePath := flag.String("node-path-pids", "", "process IDs of the Node prototype's click path besides node (its Redis), comma-separated")
	concurrency := flag.Int("c", 32, "concurrent callers")
	duration := flag.Duration("d", 10*time.Second, "duration of each measurement")
	rounds := flag.Int("rounds", 2, "times every server is measured, in turns")
	group := flag.String("group", "analytics", "kurz's click consumer group, waited for before every measurement")
	settleMax := flag.Duration("settle", 2*time.Minute, "the longest wait for kurz's click consumers to catch up before a measurement (0: do not wait)")
	settleOnly := flag.Bool("settle-only", false, "only wait for kurz's click consumers to catch up, then exit")
	flag.Parse()
	if *concurrency < 1 || *duration <= 0 || *rounds < 1 {
		return errors.New("-c, -d and -rounds must be positive")
	}
	wait := func() error {
		if *settleMax <= 0 {
			return nil
		}
		took, err := settle(context.Background(), *group, *settleMax)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "redirectpeers: kurz's click consumers caught up in %v\n", took.Round(time.Millisecond))
		return nil
	}
	if *settleOnly {
		return wait()
	}
	code, err := linkcode.Sequential(viralID)
	if err != nil {
		return err
	}
	ctx := context.Background()

	var servers []*server
	if *fixedAddr != "" {
		servers = append(servers, &server{name: "net/http fixed 302", addr: *fixedAddr, pid: *fixedPID})
	}
	if *nodeAddr != "" {
		path, err := loadgen.ParsePIDs(*nodePath)
		if err != nil {
			return err
		}
		rdb := redis.NewClient(&redis.Options{Addr: *nodeRedis})
		err = rdb.Set(ctx, linkcache.Key(code), viralURL, 0).Err()
		rdb.Close()
		if err != nil {
			return fmt.Errorf("node prototype's redis: %w", err)
		}
		servers = append(servers, &server{name: "Node prototype", addr: *nodeAddr, pid: *nodePID, path: path, clicks: true})
	}
	if *kurzAddr != "" {
		path, err := loadgen.ParsePIDs(*kurzPath)
		if err != nil {
			return err
		}
		if err := seedKurz(ctx, code); err != nil {
			return err
		}
		servers = append(servers, &server{name: "kurz redirect", addr: *kurzAddr, pid: *kurzPID, path: path, clicks: true, kurz: true})
		consumers, err := loadgen.ParsePIDs(*kurzConsumers)
		if err != nil {
			return err
		}
		if len(consumers) > 0 {
			// ^C or SIGTERM during a paused run must not leave the
			// consumers stopped.
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
			go func() {
				<-sigs
				_ = signalAll(consumers, syscall.SIGCONT)
				os.Exit(130)
			}()
			servers = append(servers, &server{name: "kurz redirect, click consumer paused", addr: *kurzAddr, pid: *kurzPID, clicks: true, kurz: true, pause: consumers})
		}
	}
	if len(servers) == 0 {
		return errors.New("no server: set -fixed302, -node or -kurz")
	}

	client := &http.Client{
		Transport:     &http.Transport{MaxIdleConnsPerHost: *concurrency, MaxConnsPerHost: *concurrency},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       5 * time.Second,
	}
	for _, s := range servers {
		s.url = "http://" + s.addr + "/" + code
		if _, err := s.get(client); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	for range *rounds {
		for _, s := range servers {
			if err := wait(); err != nil {
				return err
			}
			if err := s.measure(client, *concurrency, *duration); err != nil {
				return err
			}
		}
	}
	// The clicks of a run with the consumers paused are consumed after it:
	// every one of them has to reach the consumer group.
	if err := wait(); err != nil {
		return err
	}
	report(os.Stdout, servers, *concurrency, *duration, *rounds)
	return nil
}

// settle waits until kurz's click consumers have caught up: every click
// stream's group has nothing left to read and nothing pending. Clicks an
// earlier measurement queued would otherwise be consumed on the same cores
// during the next one, slowing whichever server runs then (with the stack
// on two cores, a backlog halved the next run's rate). It gives up after
// most.
func settle(ctx context.Context, group string, most time.Duration) (time.Duration, error) {
	var sc clickevent.StreamConfig
	if err := config.Load(&sc); err != nil {
		return 0, err
	}
	rdb, err := loadgen.Redis(ctx)
	if err != nil {
		return 0, err
	}
	defer rdb.Close()
	start := time.Now()
	for {
		behind, err := clickevent.TotalBacklog(ctx, rdb, clickevent.StreamKeys(sc.Shards), group)
		if err != nil {
			return 0, err
		}
		if behind == 0 {
			return time.Since(start), nil
		}
		if time.Since(start) > most {
			return 0, fmt.Errorf("kurz's click consumers still %d entries behind after %v", behind, most)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// seedKurz writes code's link to kurz's link cache, as the shortener's
// write-through does.
func seedKurz(ctx context.Context, code string) error {
	rdb, err := loadgen.Redis(ctx)
	if err != nil {
		return err
	}
	defer rdb.Close()
	e := linkcache.Entry{State: linkcache.Active, URL: viralURL, Tenant: "bench"}
	if err := rdb.Set(ctx, linkcache.Key(code), linkcache.Marshal(e), time.Hour).Err(); err != nil {
		return fmt.Errorf("seed kurz link cache: %w", err)
	}
	return nil
}

// server is one redirect server under load.
type server struct {
	name, addr, url string
	pid             int   // 0 = unknown
	path            []int // the click path's other processes
	clicks          bool  // records clicks (has a click path)
	kurz            bool
	pause           []int // stopped during each run (SIGSTOP), continued after
	rounds          []*loadgen.Result
	cpu, pathCPU    time.Duration
}

// get makes one request and checks it is the viral link's 302; it returns
// the response's X-Source (kurz: l1, cache, db).
func (s *server) get(client *http.Client) (string, error) {
	resp, err := client.Get(s.url)
	if err != nil {
		return "", err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != viralURL {
		return "", fmt.Errorf("status %d, Location %q: want 302 to %s", resp.StatusCode, resp.Header.Get("Location"), viralURL)
	}
	return resp.Header.Get("X-Source"), nil
}

// measure runs one round and charges the CPU time of s's processes.
func (s *server) measure(client *http.Client, c int, d time.Duration) error {
	cpu0, path0, err := s.readCPU()
	if err != nil {
		return err
	}
	if err := signalAll(s.pause, syscall.SIGSTOP); err != nil {
		return errors.Join(err, signalAll(s.pause, syscall.SIGCONT))
	}
	res := loadgen.Closed(s.name, c, d, func(int) (string, error) { return s.get(client) })
	if err := signalAll(s.pause, syscall.SIGCONT); err != nil {
		return err
	}
	cpu1, path1, err := s.readCPU()
	if err != nil {
		return err
	}
	s.cpu += cpu1 - cpu0
	s.pathCPU += path1 - path0
	s.rounds = append(s.rounds, res)
	res.Print(os.Stderr)
	return nil
}

// signalAll sends sig to every process of pids.
func signalAll(pids []int, sig syscall.Signal) error {
	var errs []error
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil {
			errs = append(errs, fmt.Errorf("%v to process %d: %w", sig, pid, err))
		}
	}
	return errors.Join(errs...)
}

// readCPU returns the CPU time used so far by the server and by its whole
// click path (the server included).
func (s *server) readCPU() (own, path time.Duration, err error) {
	if s.pid == 0 {
		return 0, 0, nil
	}
	if own, err = loadgen.CPU(s.pid); err != nil {
		return 0, 0, err
	}
	rest, err := loadgen.CPU(s.path...)
	return own, own + rest, err
}

// perRequest is a CPU time per request in microseconds; NaN when unknown.
func perRequest(cpu time.Duration, n int, known bool) float64 {
	if !known || n == 0 {
		return math.NaN()
	}
	return float64(cpu.Microseconds()) / float64(n)
}

func (s *server) figures() (r *loadgen.Result, cpu, path float64) {
	r = loadgen.Merge(s.name, s.rounds...)
	cpu = perRequest(s.cpu, r.N, s.pid != 0)
	path = perRequest(s.pathCPU, r.N, s.pid != 0 && s.clicks && len(s.path) > 0)
	return r, cpu, path
}

// report writes the measurements and kurz's ratios to each peer as markdown.
func report(out io.Writer, servers []*server, c int, d time.Duration, rounds int) {
	fmt.Fprintf(out, "Closed loop, %d HTTP callers (keep-alive), one viral code, %v per measurement, %d round(s), servers in turns. "+
		"CPU per request: user + system time (/proc) of the server process over its runs, per request; click path: the server and every process that carries its clicks to storage "+
		"(Node: its Redis; kurz: analytics, limiter, the 6 Redis servers, ClickHouse), over the same time (clicks still queued at the end are not counted). "+
		"\"click consumer paused\": kurz again with its click consumer (analytics) stopped during the run, as the peers consume nothing; the clicks it appended are consumed after the run (the next measurement waits for the consumer group to catch up), so its click path CPU is not comparable.\n\n", c, d, rounds)
	fmt.Fprintln(out, "| server | requests/s | p50 | p99 | p99.9 | server CPU µs/request | click path CPU µs/request | served from | errors |")
	fmt.Fprintln(out, "|---|---:|---:|---:|---:|---:|---:|---|---:|")
	for _, s := range servers {
		r, cpu, path := s.figures()
		from := "–"
		if s.kurz {
			from = sources(r)
		}
		fmt.Fprintf(out, "| %s | %.0f | %v | %v | %v | %s | %s | %s | %d |\n", s.name, r.Rate(),
			r.Quantile(0.5).Round(time.Microsecond), r.Quantile(0.99).Round(time.Microsecond), r.Quantile(0.999).Round(time.Microsecond),
			fmtMicros(cpu), fmtMicros(path), from, r.Errors)
	}
	if !slices.ContainsFunc(servers, func(s *server) bool { return s.kurz }) {
		return
	}
	var vs []versus
	fmt.Fprintln(out, "\n| kurz redirect / peer | throughput | p99 | server CPU/request | click path CPU/request |")
	fmt.Fprintln(out, "|---|---:|---:|---:|---:|")
	for _, ks := range servers {
		if !ks.kurz {
			continue
		}
		k, kcpu, kpath := ks.figures()
		for _, s := range servers {
			if s.kurz {
				continue
			}
			p, pcpu, ppath := s.figures()
			v := versus{kurz: ks, peer: s, throughput: nan, p99: nan, cpu: nan, path: nan}
			if k.Errors == 0 && p.Errors == 0 {
				v.throughput, v.p99 = k.Rate()/p.Rate(), float64(k.Quantile(0.99))/float64(p.Quantile(0.99))
				v.cpu, v.path = kcpu/pcpu, kpath/ppath
			}
			vs = append(vs, v)
			fmt.Fprintf(out, "| %s vs %s | %s | %s | %s | %s |\n", ks.name, s.name,
				fmtRatio(v.throughput), fmtRatio(v.p99), fmtRatio(v.cpu), fmtRatio(v.path))
		}
	}
	fmt.Fprintln(out, "\nRatios above 1: kurz is faster (throughput) or costlier (latency, CPU) than the peer; \"–\" where either side had errors (their requests are in neither the rates nor the percentiles).")
	targets(out, servers, vs)
}

// versus is a kurz measurement beside a peer's, as ratios (NaN where
// either had errors).
type versus struct {
	kurz, peer                 *server
	throughput, p99, cpu, path float64
}

// targets writes issue #15's targets for the redirect, each with this
// run's figure and whether it is met, for each kurz measurement.
func targets(out io.Writer, servers []*server, vs []versus) {
	var t loadgen.Targets
	for _, ks := range servers {
		if !ks.kurz {
			continue
		}
		for _, v := range vs {
			if v.kurz != ks {
				continue
			}
			switch v.peer.name {
			case "net/http fixed 302":
				t.Add(fmt.Sprintf("%s: requests/s ≥ 0.7× %s", ks.name, v.peer.name), fmtRatio(v.throughput), v.throughput >= 0.7)
				t.Add(fmt.Sprintf("%s: server CPU per request ≤ 1.3× %s's", ks.name, v.peer.name), fmtRatio(v.cpu), v.cpu <= 1.3)
			case "Node prototype":
				t.Add(fmt.Sprintf("%s: requests/s ≥ 1.0× %s", ks.name, v.peer.name), fmtRatio(v.throughput), v.throughput >= 1.0)
			}
		}
		r, _, _ := ks.figures()
		p99 := r.Quantile(0.99)
		figure := "–"
		if r.Errors == 0 && r.N > 0 {
			figure = fmt.Sprintf("%.2f ms", float64(p99)/float64(time.Millisecond))
		}
		t.Add(fmt.Sprintf("%s: p99 ≤ 5 ms", ks.name), figure, figure != "–" && p99 <= 5*time.Millisecond)
	}
	t.Write(out, "Issue #15's targets for the redirect (one viral code), this run:")
}

// sources lists the X-Source values of r's answers in shares.
func sources(r *loadgen.Result) string {
	s := ""
	for _, k := range slices.Sorted(maps.Keys(r.Tags)) {
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf("%s %.1f%%", k, 100*float64(r.Tags[k])/float64(max(1, r.N)))
	}
	return s
}

var nan = math.NaN()

func fmtMicros(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

func fmtRatio(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "–"
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + " x"
}
