package resp

import (
	"bufio"
	"math"
	"net"
	"slices"
	"strings"
	"testing"
)

func reader(s string) *bufio.Reader { return bufio.NewReaderSize(strings.NewReader(s), 16) }

func TestACommandReadsBackAsItWasWritten(t *testing.T) {
	args := []string{"XADD", "clicks:{0}", "", "a\r\nb", strings.Repeat("é", 40)}
	b := AppendCommand([]byte("kept"), args...)
	b = AppendArray(b, 2)
	b = AppendBulk(b, "INCRBY")
	b = AppendBulkInt(b, math.MinInt64)
	if string(b[:4]) != "kept" {
		t.Fatalf("the buffer's start was overwritten: %q", b[:4])
	}
	r := bufio.NewReader(strings.NewReader(string(b[4:])))
	for _, want := range [][]string{args, {"INCRBY", "-9223372036854775808"}} {
		got, err := ReadCommand(r)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("ReadCommand = %q, %v; want %q", got, err, want)
		}
	}
	if _, err := ReadCommand(r); err == nil {
		t.Error("ReadCommand after the last command: no error")
	}
}

func TestReadCommandRefusesWhatIsNotOne(t *testing.T) {
	for _, in := range []string{"+OK\r\n", "*1\r\n:1\r\n", "*1\r\n$3\r\nabcd\r\n", "*-2\r\n", "*1\r\n$-1\r\n", "*2\r\n$1\r\na\r\n"} {
		if _, err := ReadCommand(bufio.NewReader(strings.NewReader(in))); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

func TestReadLine(t *testing.T) {
	r := reader(":42\r\n+OK\r\n")
	for _, want := range []string{":42", "+OK"} {
		if got, err := ReadLine(r); err != nil || string(got) != want {
			t.Fatalf("ReadLine = %q, %v; want %q", got, err, want)
		}
	}
	for _, bad := range []string{"\r\n", ":1\n", ":1\r", ":" + strings.Repeat("9", 40) + "\r\n"} {
		if got, err := ReadLine(reader(bad)); err == nil {
			t.Errorf("%q: ReadLine = %q, want an error", bad, got)
		}
	}
}

func TestParseInt(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "-1": -1, "9223372036854775807": math.MaxInt64, "-9223372036854775808": math.MinInt64, "0042": 42} {
		if got, ok := ParseInt([]byte(in)); !ok || got != want {
			t.Errorf("ParseInt(%q) = %d, %v; want %d", in, got, ok, want)
		}
	}
	for _, bad := range []string{"", "-", "+1", "9223372036854775808", "-9223372036854775809", "1a", "12345678901234567890"} {
		if got, ok := ParseInt([]byte(bad)); ok {
			t.Errorf("ParseInt(%q) = %d, want refused", bad, got)
		}
	}
}

func TestAuthSendsTheCredentialsAndReadsTheAnswer(t *testing.T) {
	if err := Auth(nil, nil, "", ""); err != nil {
		t.Fatalf("without a password: %v, want nothing sent and no error", err)
	}
	for _, tc := range []struct {
		user, answer string
		want         []string
		fails        bool
	}{
		{"", "+OK\r\n", []string{"AUTH", "pw"}, false},
		{"app", "+OK\r\n", []string{"AUTH", "app", "pw"}, false},
		{"", "-WRONGPASS invalid username-password pair\r\n", []string{"AUTH", "pw"}, true},
		// Redis 7's answer to a password it has none for: go-redis's
		// connections go on, and so must these.
		{"", "-ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?\r\n", []string{"AUTH", "pw"}, false},
		{"", "-ERR unknown command\r\n", []string{"AUTH", "pw"}, true},
	} {
		client, server := net.Pipe()
		got := make(chan []string, 1)
		go func() {
			args, _ := ReadCommand(bufio.NewReader(server))
			got <- args
			_, _ = server.Write([]byte(tc.answer))
		}()
		err := Auth(client, bufio.NewReader(client), tc.user, "pw")
		if args := <-got; !slices.Equal(args, tc.want) {
			t.Errorf("user %q: sent %q, want %q", tc.user, args, tc.want)
		}
		if (err != nil) != tc.fails || (tc.fails && !strings.Contains(err.Error(), strings.TrimPrefix(strings.Fields(tc.answer)[0], "-"))) {
			t.Errorf("user %q, answer %q: %v", tc.user, tc.answer, err)
		}
		_ = client.Close()
		_ = server.Close()
	}
}

func TestNotServed(t *testing.T) {
	for _, msg := range []string{"MOVED 3999 127.0.0.1:7002", "ASK 3999 127.0.0.1:7002", "TRYAGAIN Multiple keys request during rehashing of slot",
		"CLUSTERDOWN The cluster is down", "LOADING Redis is loading the dataset in memory", "READONLY You can't write against a read only replica.",
		"MASTERDOWN Link with MASTER is down", "BUSY Redis is busy running a script."} {
		if !NotServed(msg) {
			t.Errorf("NotServed(%q) = false", msg)
		}
	}
	for _, msg := range []string{"OOM command not allowed when used memory > 'maxmemory'.", "ERR wrong number of arguments", "NOSCRIPT No matching script.", "MOVEDX", ""} {
		if NotServed(msg) {
			t.Errorf("NotServed(%q) = true", msg)
		}
	}
}
