package loadgen

import (
	"os"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// A command name with spaces and parentheses: the fields count from the
	// last ')'. utime 250 and stime 70 ticks of 10 ms.
	stat := "4242 (my (odd) server) S 1 4242 4242 0 -1 4194560 1200 0 3 0 250 70 0 0 20 0 9 0 5000 1000000 400 18446744073709551615\n"
	got, err := parseStatCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3200 * time.Millisecond; got != want {
		t.Errorf("cpu %v, want %v", got, want)
	}
	for _, bad := range []string{"", "4242 no name", "4242 (x) S 1 2", "4242 (x) S 1 4242 4242 0 -1 0 0 0 0 0 x 70 0"} {
		if _, err := parseStatCPU(bad); err == nil {
			t.Errorf("parseStatCPU(%q): no error", bad)
		}
	}
}

func TestCPUOfThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	if _, err := CPU(os.Getpid(), os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if _, err := CPU(-1); err == nil {
		t.Error("CPU of pid -1: no error")
	}
}

func TestMergeAddsRounds(t *testing.T) {
	a := &Result{N: 3, Errors: 1, Elapsed: time.Second, Tags: map[string]int{"x": 3},
		latencies: []time.Duration{1, 2, 3}}
	b := &Result{N: 1, Elapsed: time.Second, Tags: map[string]int{"x": 1, "y": 1},
		latencies: []time.Duration{9}}
	m := Merge("both", a, b)
	if m.Name != "both" || m.N != 4 || m.Errors != 1 || m.Elapsed != 2*time.Second ||
		m.Tags["x"] != 4 || m.Tags["y"] != 1 || m.Rate() != 2 || m.Quantile(1) != 9 {
		t.Errorf("merged %+v", m)
	}
}

func TestParsePIDs(t *testing.T) {
	got, err := ParsePIDs(" 12,3 ,,45")
	if err != nil || len(got) != 3 || got[0] != 12 || got[1] != 3 || got[2] != 45 {
		t.Errorf("ParsePIDs = %v, %v", got, err)
	}
	if got, err := ParsePIDs(""); err != nil || len(got) != 0 {
		t.Errorf("ParsePIDs(\"\") = %v, %v", got, err)
	}
	for _, bad := range []string{"x", "1,-2", "0"} {
		if _, err := ParsePIDs(bad); err == nil {
			t.Errorf("ParsePIDs(%q): no error", bad)
		}
	}
}
