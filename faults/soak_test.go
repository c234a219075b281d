//go:build integration

package faults

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// soakDuration is how long the soak runs: KURZ_SOAK_DURATION, 60 s by
// default (make test); `make soak` runs it for 5 minutes.
func soakDuration(t *testing.T) time.Duration {
	t.Helper()
	d := 60 * time.Second
	if v := os.Getenv("KURZ_SOAK_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("KURZ_SOAK_DURATION=%q: %v", v, err)
		}
	}
	return d
}

// resources is one service's footprint at one moment, from its /metrics.
type resources struct {
	goroutines, fds, heap float64
}

func footprint(t *testing.T, s *service) resources {
	m := scrape(t, s)
	return resources{goroutines: m.sum("go_goroutines"), fds: m.sum("process_open_fds"), heap: m.sum("go_memstats_heap_inuse_bytes")}
}

// A bounded run at a steady rate through the gateway (API reads) and the
// redirect (clicks into the consumer), every service on a Redis Cluster of
// its own. Goroutines, open file descriptors and heap stay flat (the last
// third of the run against the first, after a warm-up); every Redis key the
// run created either carries a TTL or is a click stream; and the limiter's
// keys are all gone within their TTL once the load stops.
func TestSoak(t *testing.T) {
	duration := soakDuration(t)
	cluster := privateCluster(t)
	onCluster := "KURZ_REDIS_ADDRS=" + strings.Join(cluster.Addrs(), ",")
	limiter := startService(t, "limiter", onCluster, "KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE="+testdata(t, "soak.yaml"))
	viaLimiter := "KURZ_LIMITER_GRPC_ADDR=" + limiter.grpcAddr
	shortener := startService(t, "shortener", viaLimiter, onCluster, "KURZ_SHORTENER_BASE_URL=http://short.test")
	redirect := startService(t, "redirect", viaLimiter, onCluster)
	analytics := startService(t, "analytics", viaLimiter, onCluster)
	gateway := startService(t, "gateway", viaLimiter, onCluster,
		"KURZ_SHORTENER_GRPC_ADDR="+shortener.grpcAddr, "KURZ_ANALYTICS_GRPC_ADDR="+analytics.grpcAddr,
		"KURZ_GATEWAY_ADMIN_TOKEN="+adminToken, "KURZ_GATEWAY_TRUSTED_PROXIES=127.0.0.1/32")
	services := []*service{limiter, shortener, redirect, analytics, gateway}
	user := newTenant(t, gateway, "198.51.100.7")
	var codes []string
	for i := range 50 {
		st, body, _ := user.do("POST", "/v1/links", fmt.Sprintf(`{"longUrl":"https://example.com/soak/%d"}`, i))
		if st != http.StatusOK && st != http.StatusCreated {
			t.Fatalf("create link: %d %s", st, body)
		}
		codes = append(codes, field(t, body, "code"))
	}

	// A steady rate: each worker paces itself to one request every 20 ms.
	pace := func(call func(i int) sample) func(ctx context.Context, w, i int) sample {
		return func(ctx context.Context, w, i int) sample {
			next := time.Now().Add(20 * time.Millisecond)
			s := call(i)
			time.Sleep(time.Until(next)) // the load's rate, not synchronisation
			return s
		}
	}
	api := startLoad(2, pace(func(i int) sample {
		st, _, _ := user.do("GET", "/v1/links/"+codes[i%len(codes)], "")
		return sample{ok: st == http.StatusOK, outcome: fmt.Sprint(st)}
	}))
	clicks := redirectLoad(t, redirect, codes, 2)

	var samples [][]resources
	start := time.Now()
	for time.Since(start) < duration {
		row := make([]resources, len(services))
		for i, s := range services {
			row[i] = footprint(t, s)
		}
		samples = append(samples, row)
		time.Sleep(duration / 30) // the sampling period
	}
	apiSamples := api.stop()
	clickSamples := clicks.stop()
	for _, s := range apiSamples {
		if !s.ok {
			t.Fatalf("an API request failed during the soak: %s", s.outcome)
		}
	}
	checkRedirects(t, clickSamples)

	// Flat: the last third against the first third after a warm-up third.
	// Goroutines and descriptors compare by their floor in each third: a
	// leak raises the floor, while work in flight at a sampling moment (the
	// consumer's flood-check workers live for one batch) only raises a peak.
	// The heap compares by its peak.
	third := len(samples) / 3
	for i, s := range services {
		first, last := footprints(samples[third:2*third], i), footprints(samples[2*third:], i)
		t.Logf("%-9s goroutines %v -> %v, fds %v -> %v, heap %.1f -> %.1f MiB", s.name,
			first.goroutines, last.goroutines, first.fds, last.fds, first.heap/(1<<20), last.heap/(1<<20))
		if last.goroutines > first.goroutines*1.1+10 {
			t.Errorf("%s: goroutines grew from %v to %v", s.name, first.goroutines, last.goroutines)
		}
		if last.fds > first.fds+10 {
			t.Errorf("%s: open file descriptors grew from %v to %v", s.name, first.fds, last.fds)
		}
		if last.heap > first.heap*1.5+8<<20 {
			t.Errorf("%s: heap grew from %.1f to %.1f MiB", s.name, first.heap/(1<<20), last.heap/(1<<20))
		}
	}

	// Keys: every key has a TTL, but the click streams; the limiter's are
	// gone once idle past their TTL (windows of 2 s here).
	rdb := cluster.Client()
	defer rdb.Close()
	limiterKeys := keysWithoutTTL(t, rdb)
	if len(limiterKeys.noTTL) > 0 {
		t.Errorf("keys without a TTL after the soak: %v", limiterKeys.noTTL)
	}
	before := limiterKeys.limiter
	stopped := time.Now()
	eventually(t, 15*time.Second, "the limiter's keys expired", func() (bool, string) {
		n := keysWithoutTTL(t, rdb).limiter
		return n == 0, fmt.Sprintf("%d left", n)
	})
	report(t, "Soak: a bounded steady run through gateway and redirect", "memory, goroutines and file descriptors flat; Redis keys expire as designed", fmt.Sprintf("soak %v: %d API requests (%.0f/s, paced) and %d redirects (%.0f/s, back to back), all answered; goroutines, fds and heap flat; %d limiter keys at the end, all expired %v after the load stopped; every other key but the click streams has a TTL",
		duration, len(apiSamples), float64(len(apiSamples))/duration.Seconds(), len(clickSamples), float64(len(clickSamples))/duration.Seconds(),
		before, time.Since(stopped).Round(100*time.Millisecond)))
}

// footprints is service i's footprint over the samples: the fewest
// goroutines and descriptors, the largest heap.
func footprints(rows [][]resources, i int) resources {
	p := rows[0][i]
	for _, r := range rows[1:] {
		p.goroutines = min(p.goroutines, r[i].goroutines)
		p.fds = min(p.fds, r[i].fds)
		p.heap = max(p.heap, r[i].heap)
	}
	return p
}

type keyCensus struct {
	limiter int      // keys of the limiter's limits (rl:..., not the fleet heartbeat)
	noTTL   []string // keys without a TTL that are not click streams
}

// keysWithoutTTL scans every master of the cluster.
func keysWithoutTTL(t *testing.T, rdb *redis.ClusterClient) keyCensus {
	t.Helper()
	var (
		c  keyCensus
		mu sync.Mutex // ForEachMaster runs the masters concurrently
	)
	err := rdb.ForEachMaster(context.Background(), func(ctx context.Context, node *redis.Client) error {
		iter := node.Scan(ctx, 0, "*", 1000).Iterator()
		for iter.Next(ctx) {
			key := iter.Val()
			ttl, err := node.PTTL(ctx, key).Result()
			if err != nil {
				return err
			}
			typ := node.Type(ctx, key).Val()
			mu.Lock()
			// The fleet key is the running limiters' heartbeat, renewed
			// while they run (it has a TTL, checked below): not a limit.
			if strings.HasPrefix(key, "rl:") && !strings.HasPrefix(key, "rl:fleet:") {
				c.limiter++
			}
			if ttl < 0 && typ != "stream" && ttl != -2 {
				c.noTTL = append(c.noTTL, key)
			}
			mu.Unlock()
		}
		return iter.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
