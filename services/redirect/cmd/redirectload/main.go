// Command redirectload measures the redirect service's hot path against the
// ceiling of an HTTP redirect on this machine: a minimal net/http handler that
// answers a fixed 302, run in this process and measured with the same
// client, callers and duration in the same run.
//
//	go run ./services/redirect/cmd/redirectload -addr 127.0.0.1:8787 -c 32 -d 10s
//
// Scenarios: one viral code (L1 after the first request), and -codes codes
// drawn uniformly (Redis, then L1 within its TTL). The codes are written to
// the link cache first (pkg/linkcache), as the shortener's write-through does.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"kurz.dev/pkg/config"
	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/pkg/redisconn"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "redirectload:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:8787", "redirect service address")
	concurrency := flag.Int("c", 32, "concurrent callers")
	duration := flag.Duration("d", 10*time.Second, "duration of each measurement")
	codes := flag.Int("codes", 10000, "codes drawn uniformly in the spread scenario")
	flag.Parse()

	var rc redisconn.Config
	if err := config.Load(&rc); err != nil {
		return err
	}
	ctx := context.Background()
	rdb, err := redisconn.New(ctx, rc)
	if err != nil {
		return err
	}
	defer rdb.Close()
	all := make([]string, *codes)
	for i := range all {
		// IDs far above any sequence a real shortener reaches here.
		if all[i], err = linkcode.Sequential(3_000_000_000_000 + int64(i)); err != nil {
			return err
		}
		if err := linkcache.WriteThrough(ctx, rdb, all[i], linkcache.Entry{State: linkcache.Active, URL: "https://example.com/bench", Tenant: "bench"}, time.Hour); err != nil {
			return fmt.Errorf("seed link cache: %w", err)
		}
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	baseline := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "https://example.com/bench")
		w.Header().Set("Cache-Control", "private, max-age=0")
		w.WriteHeader(http.StatusFound)
	})}
	go func() { _ = baseline.Serve(lis) }()
	defer baseline.Close()

	client := &http.Client{
		Transport:     &http.Transport{MaxIdleConnsPerHost: *concurrency, MaxConnsPerHost: *concurrency},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       5 * time.Second,
	}
	base := measure(client, *concurrency, *duration, func() string { return "http://" + lis.Addr().String() + "/" + all[0] })
	base.print("baseline: net/http fixed 302")
	viral := measure(client, *concurrency, *duration, func() string { return "http://" + *addr + "/" + all[0] })
	viral.print("redirect: one viral code")
	spread := measure(client, *concurrency, *duration, func() string { return "http://" + *addr + "/" + all[rand.IntN(len(all))] })
	spread.print(fmt.Sprintf("redirect: %d codes, uniform", *codes))
	fmt.Printf("ratio: viral = %.2f x baseline, spread = %.2f x baseline\n", viral.rate()/base.rate(), spread.rate()/base.rate())
	return nil
}

type result struct {
	n, errs   int
	sources   map[string]int
	elapsed   time.Duration
	latencies []time.Duration
}

func (r result) rate() float64 { return float64(r.n) / r.elapsed.Seconds() }

func (r result) print(name string) {
	slices.Sort(r.latencies)
	q := func(p float64) time.Duration {
		if len(r.latencies) == 0 {
			return 0
		}
		return r.latencies[int(p*float64(len(r.latencies)-1))]
	}
	fmt.Printf("%-36s %8.0f/s  p50 %-8v p99 %-8v p99.9 %-8v errors %d sources %v\n", name, r.rate(),
		q(0.5).Round(time.Microsecond), q(0.99).Round(time.Microsecond), q(0.999).Round(time.Microsecond), r.errs, r.sources)
}

func measure(client *http.Client, concurrency int, d time.Duration, url func() string) result {
	var mu sync.Mutex
	total := result{sources: map[string]int{}}
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for range concurrency {
		wg.Go(func() {
			local := result{sources: map[string]int{}}
			for time.Now().Before(stop) {
				t0 := time.Now()
				resp, err := client.Get(url())
				local.latencies = append(local.latencies, time.Since(t0))
				local.n++
				if err != nil || resp.StatusCode != http.StatusFound {
					local.errs++
				}
				if err == nil {
					local.sources[resp.Header.Get("X-Source")]++
					resp.Body.Close()
				}
			}
			mu.Lock()
			total.n += local.n
			total.errs += local.errs
			for k, v := range local.sources {
				total.sources[k] += v
			}
			total.latencies = append(total.latencies, local.latencies...)
			mu.Unlock()
		})
	}
	wg.Wait()
	total.elapsed = time.Since(start)
	return total
}
