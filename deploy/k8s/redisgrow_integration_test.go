//go:build integration

package k8s

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	appsv1 "k8s.io/api/apps/v1"

	"kurz.dev/pkg/testkit/servertest"
)

// The dev overlay's Redis Jobs, run for real: redis-server processes started
// with the StatefulSet's own arguments, each on a loopback address of its
// own (127.A.B.1x, port 6379, as every pod has its IP; A and B drawn at
// random so that two runs on one machine do not meet), and the Jobs' scripts
// run as they are rendered. Only name resolution is stood in for: getent and
// redis-cli see the pods' DNS names mapped to those addresses. The cluster
// is private to this test (not the stack's).
const growPassword = "dev-only-grow-test-password"

// podIP is the loopback address standing in for pod redis-<i>.
func podIP(i int) string { return fmt.Sprintf("%s.%d", podNet, 10+i) }

// podNet is the /24 of loopback addresses this run's pods get.
var podNet = fmt.Sprintf("127.%d.%d", 1+rand.IntN(254), rand.IntN(256))

func TestRedisJobsFormAndGrowTheCluster(t *testing.T) {
	r := render(t, "overlays/dev")
	initScript, _ := jobScript(t, r, "redis-cluster-init")
	growScript, _ := jobScript(t, r, "redis-cluster-grow")
	sts := byName[appsv1.StatefulSet](r)["redis"]
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found (deploy/local/infra.sh installs it): %v", bin, err)
		}
	}
	realCLI, _ := exec.LookPath("redis-cli")
	dir := t.TempDir()
	shims := filepath.Join(dir, "bin")
	if err := os.MkdirAll(shims, 0o755); err != nil {
		t.Fatal(err)
	}
	domain := ".redis-headless.kurz.svc.cluster.local"
	// pod maps a pod's DNS name (with anything after it) to its address.
	pod := `idx=${a#redis-}; idx=${idx%%.*}; rest=${a#*` + domain + `}; a="` + podNet + `.$((10 + idx))$rest"`
	writeShim := func(name, body string) {
		if err := os.WriteFile(filepath.Join(shims, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeShim("redis-cli", `n=$#
while [ "$n" -gt 0 ]; do
  a=$1; shift; n=$((n - 1))
  case $a in redis-*`+domain+`*) `+pod+` ;; esac
  set -- "$@" "$a"
done
exec `+realCLI+` "$@"
`)
	writeShim("getent", `[ "$1" = hosts ] || exit 2
a=$2
case $a in redis-*`+domain+`) `+pod+`; echo "$a   $2" ;; *) exit 2 ;; esac
`)

	stops := map[int]func(){}
	stop := func(i int) { stops[i]() }
	start := func(i int) {
		t.Helper()
		name := fmt.Sprintf("redis-%d", i)
		data := filepath.Join(dir, name)
		if err := os.MkdirAll(data, 0o755); err != nil {
			t.Fatal(err)
		}
		vars := map[string]string{"$(POD_NAME)": name, "$(POD_NAMESPACE)": "kurz", "$(REDIS_PASSWORD)": growPassword}
		var args []string
		for _, a := range sts.Spec.Template.Spec.Containers[0].Args[1:] { // [0] is redis-server
			for k, v := range vars {
				a = strings.ReplaceAll(a, k, v)
			}
			if rest, ok := strings.CutPrefix(a, "/data"); ok {
				a = data + rest
			}
			args = append(args, a)
		}
		// A pod has an address of its own: bind, announce and connect from
		// this node's (loopback connections would come from 127.0.0.1).
		args = append(args, "--bind", podIP(i), "--bind-source-addr", podIP(i), "--cluster-announce-ip", podIP(i),
			"--daemonize", "no", "--save", "")
		cmd := exec.Command("redis-server", args...)
		logf, err := os.Create(filepath.Join(data, "redis.log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); _ = logf.Close(); close(done) }()
		stops[i] = func() { _ = cmd.Process.Kill(); <-done }
		t.Cleanup(stops[i])
		if !servertest.Eventually(10*time.Second, func() bool {
			c, err := net.Dial("tcp", podIP(i)+":6379")
			if err == nil {
				c.Close()
			}
			return err == nil
		}) {
			log, _ := os.ReadFile(filepath.Join(data, "redis.log"))
			t.Fatalf("%s does not listen on %s:6379\n%s", name, podIP(i), log)
		}
	}
	run := func(script string, env ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "sh", "-c", script)
		cmd.Env = append(os.Environ(), "PATH="+shims+":"+os.Getenv("PATH"), "POD_NAMESPACE=kurz", "REDISCLI_AUTH="+growPassword)
		cmd.Env = append(cmd.Env, env...)
		cmd.WaitDelay = 5 * time.Second // a redis-cli left behind holds the output open
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", env, err, out)
		}
		return string(out)
	}

	for i := range 6 {
		start(i)
	}
	if out := run(initScript); !strings.Contains(out, "cluster_state:ok") {
		t.Fatalf("redis-cluster-init: %s", out)
	}
	if out := run(initScript); !strings.Contains(out, "already formed; nothing to do") {
		t.Errorf("redis-cluster-init again: want nothing done, got\n%s", out)
	}
	// At the rendered size the grow Job adds and moves nothing.
	if out := run(growScript, "REDIS_NODES=6"); strings.Contains(out, "adding") || !strings.Contains(out, "No rebalancing needed") {
		t.Errorf("redis-cluster-grow at 6 nodes: want no change, got\n%s", out)
	}

	ctx := context.Background()
	newClient := func() *redis.ClusterClient {
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:    []string{podIP(0) + ":6379"},
			Password: growPassword,
			// The nodes announce their pod names, as in the cluster.
			Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				host, port, _ := net.SplitHostPort(addr)
				if name, ok := strings.CutSuffix(host, domain); ok {
					var i int
					fmt.Sscanf(name, "redis-%d", &i)
					addr = net.JoinHostPort(podIP(i), port)
				}
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			},
		})
	}
	client := newClient()
	defer client.Close()
	const keys = 2000
	for k := range keys {
		if err := client.Set(ctx, fmt.Sprintf("grow-test:%d", k), k, 0).Err(); err != nil {
			t.Fatalf("SET: %v", err)
		}
	}

	start(6)
	start(7)
	out := run(growScript, "REDIS_NODES=8")
	for _, want := range []string{"adding redis-6", "adding redis-7", "making redis-7 the replica of redis-6", "cluster_state:ok, 4 masters"} {
		if !strings.Contains(out, want) {
			t.Errorf("redis-cluster-grow to 8: output lacks %q:\n%s", want, out)
		}
	}
	// Four masters, about 16384/4 slots each, each with its replica;
	// redis-7 the replica of redis-6.
	nodes := cliOut(t, realCLI, podIP(0), "cluster", "nodes")
	masters := map[string]int{} // id -> slots
	replicaOf := map[string]string{}
	addrOf := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		addrOf[f[0]] = strings.Split(f[1], ":")[0]
		if strings.Contains(f[2], "master") {
			slots := 0
			for _, rng := range f[8:] {
				var lo, hi int
				if n, _ := fmt.Sscanf(rng, "%d-%d", &lo, &hi); n == 2 {
					slots += hi - lo + 1
				} else if n == 1 {
					slots++
				}
			}
			masters[f[0]] = slots
		} else {
			replicaOf[f[0]] = f[3]
		}
	}
	if len(masters) != 4 || len(replicaOf) != 4 {
		t.Errorf("after growing to 8: %d masters, %d replicas, want 4 and 4:\n%s", len(masters), len(replicaOf), nodes)
	}
	for id, slots := range masters {
		if slots < 16384/4*98/100 || slots > 16384/4*102/100 {
			t.Errorf("master %s (%s) serves %d slots, want 4096 within 2%%", id, addrOf[id], slots)
		}
	}
	for id, master := range replicaOf {
		if addrOf[id] == podIP(7) && addrOf[master] != podIP(6) {
			t.Errorf("redis-7 replicates %s, want redis-6", addrOf[master])
		}
	}
	// Every key survived the slots' moves.
	for k := range keys {
		if v, err := client.Get(ctx, fmt.Sprintf("grow-test:%d", k)).Int(); err != nil || v != k {
			t.Fatalf("GET grow-test:%d after growing: %v %v", k, v, err)
		}
	}
	// Again: nothing to add, nothing to move.
	if out := run(growScript, "REDIS_NODES=8"); strings.Contains(out, "adding") || !strings.Contains(out, "No rebalancing needed") {
		t.Errorf("redis-cluster-grow to 8 again: want no change, got\n%s", out)
	}

	// Shrinking back to six, as deploy/k8s/README.md says: the slots off
	// redis-6 (the pair's master), the replica and then the master out of
	// the cluster; only then do their pods stop.
	id6 := strings.TrimSpace(cliOut(t, realCLI, podIP(6), "cluster", "myid"))
	id7 := strings.TrimSpace(cliOut(t, realCLI, podIP(7), "cluster", "myid"))
	seed := podIP(0) + ":6379"
	cliOut(t, realCLI, podIP(0), "--cluster", "rebalance", seed, "--cluster-weight", id6+"=0")
	cliOut(t, realCLI, podIP(0), "--cluster", "del-node", seed, id7)
	cliOut(t, realCLI, podIP(0), "--cluster", "del-node", seed, id6)
	stop(6)
	stop(7)
	if ok, state := servertest.EventuallyState(30*time.Second, func() (bool, string) {
		info := cliOut(t, realCLI, podIP(0), "cluster", "info")
		return strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:6"), info
	}); !ok {
		t.Fatalf("after shrinking to 6: %s", state)
	}
	// A client that saw the cluster before learns the moves from MOVED
	// replies while the old pods still run; this one starts afresh, after.
	after := newClient()
	defer after.Close()
	for k := range keys {
		if v, err := after.Get(ctx, fmt.Sprintf("grow-test:%d", k)).Int(); err != nil || v != k {
			t.Fatalf("GET grow-test:%d after shrinking: %v %v", k, v, err)
		}
	}

	// A size it cannot reach in pairs is refused before anything is touched.
	cmd := exec.Command("sh", "-c", growScript)
	cmd.Env = append(os.Environ(), "PATH="+shims+":"+os.Getenv("PATH"), "POD_NAMESPACE=kurz", "REDISCLI_AUTH="+growPassword, "REDIS_NODES=9")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "even number") {
		t.Errorf("REDIS_NODES=9: %v\n%s", err, out)
	}
}

func cliOut(t *testing.T, cli, host string, args ...string) string {
	t.Helper()
	cmd := exec.Command(cli, append([]string{"-h", host}, args...)...)
	cmd.Env = append(os.Environ(), "REDISCLI_AUTH="+growPassword)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
	}
	return string(out)
}
