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
