//go:build integration && chcluster

// The cluster tier's schema tests: they stop a server of the local
// 2 shards x 2 replicas (deploy/local/chcluster.sh), so they run only
// under `make test-chcluster`.

package clickstore

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"kurz.dev/pkg/chconn"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/pkg/testkit/stack"
)

// init runs before TestMain: without the whole cluster these tests stop
// here, naming it.
func init() { stack.Gate(stack.ClickHouseCluster) }

// stopNode stops server n (1-4) of the local cluster until the test ends.
func stopNode(t *testing.T, n int) {
	t.Helper()
	script, err := filepath.Abs("../../../../deploy/local/chcluster.sh")
	if err != nil {
		t.Fatal(err)
	}
	run := func(op string) error {
		if out, err := exec.Command(script, op, fmt.Sprint(n)).CombinedOutput(); err != nil {
			return fmt.Errorf("chcluster.sh %s %d: %v\n%s", op, n, err, out)
		}
		return nil
	}
	if err := run("stop-node"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := run("start-node"); err != nil {
			t.Error(err)
		}
	})
}

// A column upgrade with a server down: the servers up get the columns and
// click_events again (its Distributed table is dropped and created anew),
// clicks go in and come out, and the server down gets it all when it
// returns. Stopping at the first statement's timeout left click_events
// dropped on every server.
func TestApplyUpgradesWithAServerDown(t *testing.T) {
	ctx := context.Background()
	ch, l, on, qual := scratchDatabase(t, "_upgrade_down_")
	if err := Apply(ctx, ch, l); err != nil {
		t.Fatal(err)
	}
	events, _ := tableOf(l, EventsTable)
	var added []string
	for _, c := range events.declared() {
		if strings.Contains(c.decl, " DEFAULT ") {
			added = []string{c.name}
		}
	}
	// The earlier version's tables: without the last column added (on
	// 18.16 a replica that missed the adding of more than two columns
	// cannot start: "Table structure in ZooKeeper is too different"),
	// click_events made over that.
	ddl := []string{`DROP TABLE ` + qual + EventsTable + on}
	for _, c := range added {
		ddl = append(ddl, `ALTER TABLE `+qual+l.Local(EventsTable)+on+` DROP COLUMN `+c)
	}
	for _, d := range Schema(l) {
		if d.Object == EventsTable {
			ddl = append(ddl, d.Stmt)
		}
	}
	if err := chconn.ApplyDDL(ctx, ch, ddl); err != nil {
		t.Fatal(err)
	}

	stopNode(t, 4)
	start := time.Now()
	if err := Apply(ctx, ch, l); err != nil {
		t.Fatalf("Apply with node4 down (after %s): %v", time.Since(start).Round(time.Second), err)
	}
	t.Logf("upgraded with node4 down in %s", time.Since(start).Round(time.Second))
	have, err := columns(ctx, ch, EventsTable)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range added {
		if !slices.Contains(have, c) {
			t.Errorf("click_events lacks %s after Apply with node4 down (has %v)", c, have)
		}
	}
	s := New(ch, l)
	at := time.Now().UTC().Truncate(time.Hour).Add(-time.Hour)
	click := Click{Tenant: "t", Code: "upgraded", Time: at, EventID: "e1", Visitor: "v", Country: "DE"}
	if err := s.Insert(ctx, []Click{click}); err != nil {
		t.Fatalf("insert after the upgrade with node4 down: %v", err)
	}
	hourly, err := s.Hourly(ctx, Range{Tenant: "t", Code: "upgraded", Start: at, End: at.Add(time.Hour)})
	if err != nil || hourly[at.Unix()].Total != 1 {
		t.Errorf("hourly after the upgrade with node4 down: %v, %v; want 1 click", hourly, err)
	}

	// node4 runs the queued statements when it returns.
	cfg := chconn.Config{Addrs: []string{"127.0.0.1:9114"}, Database: l.Database, User: "default", DialTimeout: time.Second}
	startNode := exec.Command(filepath.Join("..", "..", "..", "..", "deploy", "local", "chcluster.sh"), "start-node", "4")
	if out, err := startNode.CombinedOutput(); err != nil {
		t.Fatalf("start node4: %v\n%s", err, out)
	}
	var state string
	if !servertest.Eventually(60*time.Second, func() bool {
		ch4, err := chconn.New(ctx, cfg)
		if err != nil {
			state = err.Error()
			return false
		}
		defer ch4.Close()
		have, err := columns(ctx, ch4, EventsTable)
		state = fmt.Sprintf("click_events columns %v (%v)", have, err)
		return err == nil && !slices.ContainsFunc(added, func(c string) bool { return !slices.Contains(have, c) })
	}) {
		t.Errorf("node4 back: click_events with %v not within 60s; last: %s", added, state)
	}
}
