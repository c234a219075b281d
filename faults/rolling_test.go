//go:build integration

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/clickevent"
	"kurz.dev/pkg/config"
)

// shutdownDelay is how long a replica keeps serving after SIGTERM while it
// reports not ready, so balancers take it out of rotation first.
const shutdownDelay = 600 * time.Millisecond

// probePeriod is how often the test's balancers probe /readyz.
const probePeriod = 100 * time.Millisecond

// replicas starts n replicas of a service with env.
func replicas(t *testing.T, name string, n int, env ...string) []*service {
	t.Helper()
	out := make([]*service, n)
	for i := range out {
		e := append([]string{"KURZ_SHUTDOWN_DELAY=" + shutdownDelay.String()}, env...)
		if name == "analytics" {
			e = append(e, fmt.Sprintf("KURZ_ANALYTICS_CONSUMER_NAME=analytics-%d", i))
		}
		out[i] = startService(t, name, e...)
	}
	return out
}

// grpcList is the replicas' gRPC addresses as one client target.
func grpcList(ss []*service) string {
	addrs := make([]string, len(ss))
	for i, s := range ss {
		addrs[i] = s.grpcAddr
	}
	return strings.Join(addrs, ",")
}

func balance(t *testing.T, ss []*service) *Balancer {
	t.Helper()
	replicas := make([]Replica, len(ss))
	for i, s := range ss {
		replicas[i] = Replica{Addr: s.httpAddr, ProbeAddr: s.opsAddr}
	}
	b, err := NewBalancer(replicas, probePeriod)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// patient is noFollow waiting longer than the rolling restart's gateways
// wait for analytics (KURZ_GATEWAY_CALL_TIMEOUT), so their answer, not the
// client's patience, decides a request's fate.
var patient = &http.Client{
	Timeout:       30 * time.Second,
	CheckRedirect: noFollow.CheckRedirect,
}

// served is how many calls other than health checks a replica's gRPC server
// has answered since it started.
func served(t *testing.T, s *service) float64 {
	var n float64
	for k, v := range scrape(t, s) {
		if strings.HasPrefix(k, "rpc_server_call_duration_seconds_count{") && !strings.Contains(k, `rpc_method="grpc.health.v1.Health/`) {
			n += v
		}
	}
	return n
}

// Every service runs as two replicas (gateway and redirect behind
// balancers that probe readiness, the gRPC services behind client-side
// balancing with health checks), and each replica in turn is stopped with
// SIGTERM and started again, under steady load. Graceful shutdown drains:
// no request fails at the gateway or the redirect, and no click is lost.
func TestRollingRestart(t *testing.T) {
	cluster := privateCluster(t)
	onCluster := "KURZ_REDIS_ADDRS=" + strings.Join(cluster.Addrs(), ",")
	limiters := replicas(t, "limiter", 2, onCluster, "KURZ_LIMITER_RULES_SOURCE=file", "KURZ_LIMITER_RULES_FILE="+testdata(t, "soak.yaml"))
	viaLimiter := "KURZ_LIMITER_GRPC_ADDR=" + grpcList(limiters)
	shorteners := replicas(t, "shortener", 2, viaLimiter, onCluster, "KURZ_SHORTENER_BASE_URL=http://short.test")
	// The statistics read ClickHouse, which the stack shares with every
	// other test. With this test's clicks flowing in and other tests'
	// load on both cores, a small link's statistics took 1 to 5 s, and
	// past the gateway's 5 s call timeout they failed, restart or none;
	// a restarted replica's first ClickHouse handshake took over 3 s. A
	// drain is what is under test, not ClickHouse's speed: the reads get
	// 15 s, the handshake 10 s, and the test's client waits for the
	// gateway's answer. A request a drain drops still fails at once.
	analytics := replicas(t, "analytics", 2, viaLimiter, onCluster, "KURZ_ANALYTICS_BATCH_AGE=200ms", "KURZ_ANALYTICS_CLAIM_IDLE=2s",
		"KURZ_ANALYTICS_QUERY_TIMEOUT=15s", "KURZ_CLICKHOUSE_DIAL_TIMEOUT=10s")
	redirects := replicas(t, "redirect", 2, viaLimiter, onCluster)
	gateways := replicas(t, "gateway", 2, viaLimiter, onCluster,
		"KURZ_SHORTENER_GRPC_ADDR="+grpcList(shorteners), "KURZ_ANALYTICS_GRPC_ADDR="+grpcList(analytics),
		"KURZ_GATEWAY_ADMIN_TOKEN="+adminToken, "KURZ_GATEWAY_TRUSTED_PROXIES=127.0.0.1/32",
		"KURZ_GATEWAY_CALL_TIMEOUT=16s")
	gatewayLB, redirectLB := balance(t, gateways), balance(t, redirects)
	eventually(t, 30*time.Second, "every replica in rotation", func() (bool, string) {
		for _, s := range append(gateways, redirects...) {
			lb := gatewayLB
			if s.name == "redirect" {
				lb = redirectLB
			}
			if !lb.Ready(s.httpAddr) {
				return false, s.name + " " + s.httpAddr + " not ready"
			}
		}
		return true, ""
	})

	user := newTenant(t, gateways[0], "198.51.100.9")
	user.base = "http://" + gatewayLB.Addr()
	user.client = patient
	var codes []string
	for i := range 20 {
		st, body, _ := user.do("POST", "/v1/links", fmt.Sprintf(`{"longUrl":"https://example.com/rolling/%d"}`, i))
		if st != http.StatusOK && st != http.StatusCreated {
			t.Fatalf("create link: %d %s", st, body)
		}
		codes = append(codes, field(t, body, "code"))
	}
	api := startLoad(2, func(ctx context.Context, w, i int) sample {
		path := "/v1/links/" + codes[i%len(codes)]
		method, body := "GET", ""
		switch i % 10 {
		case 0:
			method, path, body = "POST", "/v1/links", fmt.Sprintf(`{"longUrl":"https://example.com/rolling/%d/%d"}`, w, i)
		case 5:
			path += "/stats?interval=day"
		}
		req, _ := http.NewRequest(method, user.base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+user.key)
		req.Header.Set("X-Forwarded-For", user.ip)
		resp, err := patient.Do(req)
		if err != nil {
			return sample{tag: method + " " + path, err: err}
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		resp.Body.Close()
		return sample{tag: method + " " + path, outcome: resp.Status + " " + string(b), ok: resp.StatusCode < 300}
	})
	redirect := &service{httpAddr: redirectLB.Addr()}
	// Paced: back to back, two workers sent ~550 clicks a second, more
	// than the race-built consumers stored on a loaded machine; their
	// backlog kept ClickHouse busy with inserts and merges, and the
	// statistics slow, all through the restarts.
	clicks := pacedRedirectLoad(t, redirect, codes, 2, 5*time.Millisecond)

	restarted := 0
	for _, group := range [][]*service{limiters, shorteners, analytics, redirects, gateways} {
		for _, s := range group {
			t.Logf("%v restarting %s %s", time.Now().Format("15:04:05.000"), s.name, s.grpcAddr)
			s.restart(t)
			t.Logf("%v restarted %s", time.Now().Format("15:04:05.000"), s.name)
			restarted++
			switch s.name {
			case "gateway", "redirect":
				lb := gatewayLB
				if s.name == "redirect" {
					lb = redirectLB
				}
				// Back in rotation to stay: ten probes in a row (a second).
				eventually(t, 30*time.Second, s.name+" back in rotation", func() (bool, string) { return lb.Settled(s.httpAddr, 10), "" })
			default:
				// Back in its callers' balancing: it answers calls again.
				eventually(t, 30*time.Second, s.name+" serving its callers again", func() (bool, string) {
					n := served(t, s)
					return n >= 3, fmt.Sprintf("%v calls", n)
				})
			}
		}
	}
	apiSamples, clickSamples := api.stop(), clicks.stop()
	failed := 0
	for _, s := range apiSamples {
		if s.err != nil || !s.ok {
			failed++
			t.Errorf("%v gateway request failed during the rolling restart: %s: %s %v", s.at.Format("15:04:05.000"), s.tag, s.outcome, s.err)
		}
	}
	checkRedirects(t, clickSamples)

	want := map[string]int64{}
	for _, s := range clickSamples {
		want[s.tag]++
	}
	// Every click reached the streams once and is counted once: none lost,
	// none appended or counted twice.
	var total int64
	for _, n := range want {
		total += n
	}
	rdb := cluster.Client()
	defer rdb.Close()
	var appended int64
	eventually(t, 30*time.Second, "every click in the streams", func() (bool, string) {
		appended = 0
		var streams clickevent.StreamConfig
		if err := config.Load(&streams); err != nil {
			return false, err.Error()
		}
		for _, key := range clickevent.StreamKeys(streams.Shards) {
			appended += rdb.XLen(context.Background(), key).Val()
		}
		return appended >= total, fmt.Sprintf("%d of %d", appended, total)
	})
	var counted int64
	eventually(t, 60*time.Second, "every click counted", func() (bool, string) {
		counted = 0
		for code, n := range want {
			st, body, _ := user.do("GET", "/v1/links/"+code+"/stats?interval=day", "")
			if st != http.StatusOK {
				return false, body
			}
			var s struct {
				Counts struct {
					Total int64 `json:",string"`
				}
			}
			if err := json.Unmarshal([]byte(body), &s); err != nil {
				return false, err.Error()
			}
			if s.Counts.Total < n {
				return false, fmt.Sprintf("%s: %d of %d counted", code, s.Counts.Total, n)
			}
			counted += s.Counts.Total
		}
		return true, ""
	})
	if appended != total || counted != total {
		t.Errorf("%d clicks served, %d appended to the streams, %d counted: want all equal", total, appended, counted)
	}
	report(t, "Rolling restart of every service (two replicas each, SIGTERM then start, one at a time) under load",
		"graceful shutdown drains: zero failed requests at the gateway and the redirect, zero lost clicks",
		fmt.Sprintf("%d restarts; %d gateway requests, %d failed; %d redirects, all 302; %d click events in the streams, %d counted: none lost, %d counted twice",
			restarted, len(apiSamples), failed, len(clickSamples), appended, counted, counted-total))
}
