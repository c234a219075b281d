// Command quotaload measures the limiter: C concurrent gRPC callers send
// CheckQuota for D seconds over K distinct keys, back to back (closed loop),
// or at -rate calls per second (open loop: latency counted from each call's
// scheduled start). With -baseline it first measures gRPC health checks on
// the same connections: the same callers, the same server, no Redis, so the
// ratio says what the rate-limit work costs on this machine.
//
//	go run ./services/limiter/cmd/quotaload -addr 127.0.0.1:9091 -c 32 -d 10s -baseline
//	go run ./services/limiter/cmd/quotaload -addr 127.0.0.1:9091 -c 64 -d 10s -rate 3000
//
// With -matrix it measures every algorithm of the domain (-algos), over one
// hot key and over -spread keys drawn uniformly, at each concurrency of
// -conc, closed loop, -d each. Every cell is a pair: first the ceiling,
// the limiter's decision script called directly with EVALSHA on the same
// Redis Cluster (KURZ_REDIS_* variables, as the limiter) with the key and
// arguments the limiter sends for the same rule (read from -rules, the
// built-in bootstrap file by default, and checked against the running
// limiter), then CheckQuota through the limiter; then their ratio. After the
// matrix, the token bucket over the spread keys runs open loop at half its
// highest CheckQuota rate, against the p99 target of 5 ms (README: Performance); a summary table
// and the throughput target (0.7 x EVALSHA at concurrency 64) close the
// report. Each run uses keys of its own. With the defaults it makes 80
// measurements (5 algorithms x 2 key shapes x 4 concurrencies x 2) and one
// open-loop run: about 81 x -d.
//
//	go run ./services/limiter/cmd/quotaload -addr 127.0.0.1:9091 -matrix -d 2s
//	go run ./services/limiter/cmd/quotaload -matrix -d 1s -algos token_bucket -conc 16,64
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	ratelimitv1 "kurz.dev/gen/kurz/ratelimit/v1"
	"kurz.dev/tools/loadgen"
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
	rate := flag.Float64("rate", 0, "calls per second (open loop); 0 = back to back (closed loop)")
	keys := flag.Int("k", 10000, "distinct keys (descriptor user)")
	domain := flag.String("domain", "demo", "rule domain")
	algo := flag.String("algo", "token_bucket", "value of the algo descriptor")
	conns := flag.Int("conns", 4, "gRPC connections, callers spread over them")
	baseline := flag.Bool("baseline", false, "measure gRPC health checks first, as the ceiling")
	matrix := flag.Bool("matrix", false, "measure every algorithm, key shape and concurrency against direct EVALSHA (ignores -c, -k, -algo, -rate, -baseline)")
	algos := flag.String("algos", strings.Join(matrixAlgos, ","), "-matrix: values of the algo descriptor, comma-separated")
	conc := flag.String("conc", "1,16,64,256", "-matrix: concurrencies, comma-separated")
	spread := flag.Int("spread", 100_000, "-matrix: distinct keys of the spread key shape")
	rules := flag.String("rules", "", "-matrix: rules YAML the limiter runs with; empty = the built-in bootstrap file")
	redisTarget := flag.Float64("redis-target", 0, "state whether at least this share (0..1) of the answers was decided on Redis; 0 = no target")
	flag.Parse()

	var m *matrixRun
	if *matrix {
		var ignored []string
		flag.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "c", "k", "algo", "rate", "baseline":
				ignored = append(ignored, "-"+f.Name)
			}
		})
		if len(ignored) > 0 {
			return fmt.Errorf("-matrix sets its own concurrencies, keys and algorithms; drop %s", strings.Join(ignored, " "))
		}
		var err error
		if m, err = newMatrixRun(*domain, *algos, *conc, *rules, *spread, *duration); err != nil {
			return err
		}
	}
	if *conns < 1 {
		return errors.New("-conns must be at least 1")
	}

	clients := make([]*grpc.ClientConn, *conns)
	for i := range clients {
		c, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer c.Close()
		clients[i] = c
	}
	if m != nil {
		return m.run(context.Background(), clients, os.Stdout)
	}

	measure := func(name string, call loadgen.Call) *loadgen.Result {
		if *rate > 0 {
			return loadgen.Open(fmt.Sprintf("%s @%.0f/s", name, *rate), *rate, *concurrency, *duration, call)
		}
		return loadgen.Closed(name, *concurrency, *duration, call)
	}

	var base *loadgen.Result
	if *baseline {
		base = measure("baseline: gRPC health check", func(w int) (string, error) {
			_, err := healthpb.NewHealthClient(clients[w%len(clients)]).Check(context.Background(), &healthpb.HealthCheckRequest{})
			return "", err
		})
		base.Print(os.Stdout)
	}
	users := make([]string, *keys)
	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	for i := range users {
		users[i] = "load-" + runID + "-" + strconv.Itoa(i)
	}
	res := measure("CheckQuota "+*domain+"/"+*algo, func(w int) (string, error) {
		resp, err := ratelimitv1.NewRateLimitServiceClient(clients[w%len(clients)]).CheckQuota(context.Background(), &ratelimitv1.CheckQuotaRequest{
			Domain:      *domain,
			Descriptors: map[string]string{"user": users[rand.IntN(len(users))], "algo": *algo},
		})
		if err != nil {
			return "", err
		}
		return resp.GetSource().String(), nil
	})
	res.Print(os.Stdout)
	if *redisTarget > 0 {
		onRedis := float64(res.Tags[ratelimitv1.DecisionSource_DECISION_SOURCE_REDIS.String()]) / float64(max(1, res.N+res.Errors))
		fmt.Printf("decided on Redis: %.2f%% of %d calls (target >= %.0f%%: %s)\n",
			100*onRedis, res.N+res.Errors, 100**redisTarget, loadgen.Verdict(onRedis >= *redisTarget))
	}
	if base != nil {
		fmt.Printf("ratio: CheckQuota throughput = %.2f x the health-check baseline\n", res.Rate()/base.Rate())
	}
	return nil
}
