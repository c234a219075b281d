// Command quotaload measures the limiter: C concurrent gRPC callers send
// CheckQuota for D seconds over K distinct keys, and it prints decisions per
// second and latency percentiles. Run with -baseline to measure gRPC health
// checks on the same connection first: the same callers, the same server, no
// Redis, so the ratio says what the rate-limit work costs on this machine.
//
//	go run ./services/limiter/cmd/quotaload -addr 127.0.0.1:9091 -c 32 -d 10s -baseline
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quotaload:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:9091", "limiter gRPC address")
	concurrency := flag.Int("c", 32, "concurrent callers")
	duration := flag.Duration("d", 10*time.Second, "duration of each measurement")
	keys := flag.Int("k", 10000, "distinct keys (descriptor user)")
	domain := flag.String("domain", "demo", "rule domain")
	algo := flag.String("algo", "token_bucket", "value of the algo descriptor")
	conns := flag.Int("conns", 4, "gRPC connections, callers spread over them")
	baseline := flag.Bool("baseline", false, "measure gRPC health checks first, as the ceiling")
	flag.Parse()

	clients := make([]*grpc.ClientConn, *conns)
	for i := range clients {
		c, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer c.Close()
		clients[i] = c
	}
	if *baseline {
		res := measure(*concurrency, *duration, func(worker, i int) error {
			_, err := healthpb.NewHealthClient(clients[worker%len(clients)]).Check(context.Background(), &healthpb.HealthCheckRequest{})
			return err
		})
		res.print("baseline: gRPC health check")
		base := res
		res2 := measureQuota(clients, *concurrency, *duration, *keys, *domain, *algo)
		res2.print("CheckQuota " + *domain + "/" + *algo)
		fmt.Printf("ratio: CheckQuota throughput = %.2f x the health-check baseline\n", res2.rate()/base.rate())
		return nil
	}
	measureQuota(clients, *concurrency, *duration, *keys, *domain, *algo).print("CheckQuota " + *domain + "/" + *algo)
	return nil
}

func measureQuota(clients []*grpc.ClientConn, concurrency int, d time.Duration, keys int, domain, algo string) result {
	users := make([]string, keys)
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	for i := range users {
		users[i] = "load-" + run + "-" + strconv.Itoa(i)
	}
	var denied sync.Map
	res := measure(concurrency, d, func(worker, i int) error {
		c := ratelimitv1.NewRateLimitServiceClient(clients[worker%len(clients)])
		resp, err := c.CheckQuota(context.Background(), &ratelimitv1.CheckQuotaRequest{
			Domain:      domain,
			Descriptors: map[string]string{"user": users[rand.IntN(len(users))], "algo": algo},
		})
		if err == nil && resp.GetSource() != ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS {
			v, _ := denied.LoadOrStore(resp.GetSource().String(), new(int))
			*(v.(*int))++
		}
		return err
	})
	denied.Range(func(k, v any) bool {
		fmt.Printf("  note: %d decisions served by %s (not Redis)\n", *(v.(*int)), k)
		return true
	})
	return res
}

type result struct {
	n, errs   int
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
	fmt.Printf("%-40s %9.0f/s  p50 %-8v p99 %-8v p99.9 %-8v errors %d\n", name, r.rate(),
		q(0.5).Round(time.Microsecond), q(0.99).Round(time.Microsecond), q(0.999).Round(time.Microsecond), r.errs)
}

func measure(concurrency int, d time.Duration, call func(worker, i int) error) result {
	var mu sync.Mutex
	var total result
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for w := range concurrency {
		wg.Go(func() {
			var local result
			for i := 0; time.Now().Before(stop); i++ {
				t0 := time.Now()
				err := call(w, i)
				local.latencies = append(local.latencies, time.Since(t0))
				local.n++
				if err != nil {
					local.errs++
				}
			}
			mu.Lock()
			total.n += local.n
			total.errs += local.errs
			total.latencies = append(total.latencies, local.latencies...)
			mu.Unlock()
		})
	}
	wg.Wait()
	total.elapsed = time.Since(start)
	return total
}
