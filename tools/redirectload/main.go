// Command redirectload measures the redirect service's hot path against the
// ceiling of an HTTP redirect on this machine: a minimal net/http handler that
// answers a fixed 302, run in this process and measured with the same
// client, callers and duration in the same run.
//
//	go run ./tools/redirectload -addr 127.0.0.1:8787 -c 32 -d 10s
//
// Scenarios: one viral code (L1 after the first request), the same with
// redirect rules and A/B-test variants (four rules no request matches, then
// two variants: the cost of evaluating them on the L1-hit path, compared
// with the plain code measured before and after it), -codes
// codes drawn uniformly (Redis, then L1 within its TTL), and -unknown
// unknown codes (the negative cache: 404 without PostgreSQL). The codes are written to the link
// cache first (pkg/linkcache), as the shortener's write-through and the
// redirect's own misses do.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"kurz.dev/pkg/linkcache"
	"kurz.dev/pkg/linkcode"
	"kurz.dev/pkg/linkrules"
	"kurz.dev/tools/loadgen"
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
	unknownCodes := flag.Int("unknown", 10000, "unknown codes (negative-cache hits, 404) drawn uniformly")
	rate := flag.Float64("rate", 0, "requests per second (open loop); 0 = back to back (closed loop)")
	flag.Parse()

	ctx := context.Background()
	rdb, err := loadgen.Redis(ctx)
	if err != nil {
		return err
	}
	defer rdb.Close()
	// The links exist only in Redis (the redirect's cache), under IDs far
	// above any sequence a real shortener reaches here; the unknown codes
	// are negative-cache entries, as the redirect leaves them after a miss.
	all, err := seed(ctx, rdb, 3_000_000_000_000, *codes, linkcache.Entry{State: linkcache.Active, URL: "https://example.com/bench", Tenant: "bench"})
	if err != nil {
		return err
	}
	unknown, err := seed(ctx, rdb, 3_400_000_000_000, *unknownCodes, linkcache.Entry{State: linkcache.Missing})
	if err != nil {
		return err
	}
	rules, err := linkrules.Parse([]byte(benchRules))
	if err != nil {
		return err
	}
	ruled, err := seed(ctx, rdb, 3_200_000_000_000, 1, linkcache.Entry{State: linkcache.Active, URL: "https://example.com/bench", Tenant: "bench", Rules: rules})
	if err != nil {
		return err
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
	get := func(url func() string, want ...int) loadgen.Call {
		if len(want) == 0 {
			want = []int{http.StatusFound}
		}
		return func(int) (string, error) {
			resp, err := client.Get(url())
			if err != nil {
				return "", err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if !slices.Contains(want, resp.StatusCode) {
				return "", fmt.Errorf("status %d", resp.StatusCode)
			}
			return resp.Header.Get("X-Source"), nil
		}
	}
	measure := func(name string, call loadgen.Call) *loadgen.Result {
		if *rate > 0 {
			return loadgen.Open(fmt.Sprintf("%s @%.0f/s", name, *rate), *rate, *concurrency, *duration, call)
		}
		return loadgen.Closed(name, *concurrency, *duration, call)
	}
	base := measure("baseline: net/http fixed 302", get(func() string { return "http://" + lis.Addr().String() + "/" + all[0] }))
	base.Print(os.Stdout)
	viral := measure("redirect: one viral code", get(func() string { return "http://" + *addr + "/" + all[0] }))
	viral.Print(os.Stdout)
	viralRules := measure("redirect: one viral code with rules", get(func() string { return "http://" + *addr + "/" + ruled[0] }))
	viralRules.Print(os.Stdout)
	// The plain code again: a scenario pays for the clicks the one before
	// it left in the pipeline, so rules are compared with the plain runs
	// on both sides of them.
	viralAfter := measure("redirect: one viral code, again", get(func() string { return "http://" + *addr + "/" + all[0] }))
	viralAfter.Print(os.Stdout)
	spread := measure(fmt.Sprintf("redirect: %d codes, uniform", *codes), get(func() string { return "http://" + *addr + "/" + all[rand.IntN(len(all))] }))
	spread.Print(os.Stdout)
	var miss *loadgen.Result
	if len(unknown) > 0 {
		miss = measure(fmt.Sprintf("redirect: %d unknown codes (404)", len(unknown)), get(func() string { return "http://" + *addr + "/" + unknown[rand.IntN(len(unknown))] }, http.StatusNotFound))
		miss.Print(os.Stdout)
	}
	withRules := 2 * viralRules.Rate() / (viral.Rate() + viralAfter.Rate())
	fmt.Printf("ratio: viral = %.2f x baseline, viral with rules = %.2f x viral (the mean of the runs before and after; goal >= 0.90: %s), spread = %.2f x baseline",
		viral.Rate()/base.Rate(), withRules, loadgen.Verdict(withRules >= 0.9), spread.Rate()/base.Rate())
	if miss != nil {
		fmt.Printf(", unknown = %.2f x baseline", miss.Rate()/base.Rate())
	}
	fmt.Println()
	if *rate > 0 {
		// The README's tail target for the redirect at a rate the
		// machine is not saturated by: the viral code's p99.
		for _, r := range []*loadgen.Result{viral, viralRules, viralAfter} {
			fmt.Printf("target: %s p99 <= 5 ms: %v, %s\n", r.Name, r.Quantile(0.99).Round(10*time.Microsecond), loadgen.Verdict(r.Quantile(0.99) <= 5*time.Millisecond))
		}
	}
	return nil
}

// benchRules are the rules of the rule-carrying viral code (pkg/linkrules'
// stored form): four rules, of which no request of this tool matches any
// (its client sends no Accept-Language, no query, and comes from
// loopback), then two variants.
const benchRules = `{"r":[
	{"n":"ios-de","if":[{"d":["ios"]},{"l":["de"]}],"u":"https://example.com/ios-de"},
	{"n":"german","if":[{"l":["de","fr"]}],"u":"https://example.com/de"},
	{"n":"promo","if":[{"q":{"p":"utm_source","v":"de"}}],"u":"https://example.com/promo"},
	{"n":"office","if":[{"c":["203.0.113.0/24","2001:db8::/32"]}],"u":"https://example.com/office"}],
 "v":[{"n":"a","u":"https://example.com/a","w":1},{"n":"b","u":"https://example.com/b","w":1}]}`

// seed stores n cache entries e under the codes of IDs first, first+1, ...,
// in pipelines of 10,000, and returns the codes.
func seed(ctx context.Context, rdb *redis.ClusterClient, first int64, n int, e linkcache.Entry) ([]string, error) {
	codes := make([]string, n)
	for start := 0; start < n; start += 10_000 {
		pipe := rdb.Pipeline()
		for i := start; i < min(n, start+10_000); i++ {
			code, err := linkcode.Sequential(first + int64(i))
			if err != nil {
				return nil, err
			}
			codes[i] = code
			pipe.Set(ctx, linkcache.Key(code), linkcache.Marshal(e), time.Hour)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("seed link cache: %w", err)
		}
	}
	return codes, nil
}
