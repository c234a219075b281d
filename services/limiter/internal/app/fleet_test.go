//go:build integration

package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/limiter/internal/ratelimit"
)

// fleetGauge is the limiter at httpAddr's kurz_ratelimit_fleet_replicas for
// fleet (known counts only), or -1 if it reports none.
func fleetGauge(httpAddr, fleet string) (int, error) {
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		return -1, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1, err
	}
	for line := range strings.Lines(string(body)) {
		if strings.HasPrefix(line, "kurz_ratelimit_fleet_replicas{") &&
			strings.Contains(line, `fleet="`+fleet+`"`) && strings.Contains(line, `known="true"`) {
			var n int
			_, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &n)
			return n, err
		}
	}
	return -1, nil
}

// Limiter processes count each other through the fleet key: every one's
// gauge follows replicas added, one shut down (it leaves on its way out:
// the key no longer holds it when the process has exited, long before its
// entry would expire) and one killed (its entry expires three heartbeats
// later).
func TestLimiterProcessesCountTheFleet(t *testing.T) {
	bin := buildLimiter(t)
	fleet := fleetName(t)
	type proc struct {
		p    *limiterProcess
		http string
	}
	start := func(n int) []proc {
		ps := make([]proc, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range ps {
			ps[i].http = freeAddr(t)
			grpcAddr := freeAddr(t)
			wg.Go(func() {
				ps[i].p, errs[i] = startLimiter(t, bin, grpcAddr, ps[i].http,
					"KURZ_LIMITER_FLEET_HEARTBEAT=1s", "KURZ_LIMITER_MAX_REPLICAS=12")
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		return ps
	}
	await := func(what string, want int, ps ...proc) {
		t.Helper()
		ok, state := servertest.EventuallyState(15*time.Second, func() (bool, string) {
			all, got := true, []string{}
			for _, p := range ps {
				n, err := fleetGauge(p.http, fleet)
				all = all && err == nil && n == want
				got = append(got, fmt.Sprintf("%d (err %v)", n, err))
			}
			return all, strings.Join(got, ", ")
		})
		if !ok {
			t.Fatalf("%s: fleet gauges %s, want %d on each", what, state, want)
		}
	}

	first := start(1)
	await("one limiter", 1, first...)
	more := start(2)
	all := append(first, more...)
	await("three limiters", 3, all...)

	if err := more[0].p.Stop(); err != nil { // SIGTERM: leaves the fleet
		t.Fatal(err)
	}
	// At most a second since its last heartbeat: its entry would live two
	// more, had it not left.
	if n, err := clusterClient(t).ZCard(context.Background(), ratelimit.FleetKey("", fleet)).Result(); err != nil || n != 2 {
		t.Errorf("right after a limiter shut down: %d replicas in %s (err %v), want 2", n, ratelimit.FleetKey("", fleet), err)
	}
	await("one shut down", 2, first[0], more[1])

	more[1].p.Kill() // no goodbye: counted until its entry expires
	await("one killed", 1, first[0])
}
