package stack

import (
	"net"
	"strings"
	"testing"
)

func TestCheckNamesTheComponentThatIsDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	t.Setenv("KURZ_REDIS_ADDRS", closed)
	err = Check(Redis)
	if err == nil || !strings.Contains(err.Error(), "Redis Cluster unreachable at "+closed) {
		t.Fatalf("Check(Redis) with nothing on %s = %v, want it named as unreachable", closed, err)
	}
}

func TestCheckPassesWhenOneNodeAnswers(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t.Setenv("KURZ_POSTGRES_URL", "postgres://u:p@"+l.Addr().String()+"/db")
	if err := Check(Postgres); err != nil {
		t.Fatalf("Check(Postgres) with a listener on the URL's host: %v", err)
	}
}

func TestClusterCheckNeedsEveryServerAndTheClusterName(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close()
	t.Setenv("KURZ_CLICKHOUSE_ADDRS", up.Addr().String()+","+down)
	t.Setenv("KURZ_CLICKHOUSE_CLUSTER", "")
	if err := Check(ClickHouseCluster); err == nil || !strings.Contains(err.Error(), "KURZ_CLICKHOUSE_CLUSTER") {
		t.Errorf("no cluster named: %v, want an error naming KURZ_CLICKHOUSE_CLUSTER", err)
	}
	t.Setenv("KURZ_CLICKHOUSE_CLUSTER", "kurz")
	if err := Check(ClickHouseCluster); err == nil || !strings.Contains(err.Error(), "ClickHouse cluster: unreachable at "+down) {
		t.Errorf("one server down: %v, want the cluster and that server named", err)
	}
	t.Setenv("KURZ_CLICKHOUSE_ADDRS", up.Addr().String())
	if err := Check(ClickHouseCluster); err != nil {
		t.Errorf("every server up: %v", err)
	}
}
