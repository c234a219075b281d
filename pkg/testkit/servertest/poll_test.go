package servertest

import (
	"strconv"
	"testing"
	"time"
)

func TestEventually(t *testing.T) {
	n := 0
	if !Eventually(time.Second, func() bool { n++; return n == 3 }) || n != 3 {
		t.Fatalf("Eventually stopped after %d calls, want true on the third", n)
	}
	if Eventually(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("Eventually of a condition that never holds returned true")
	}
}

func TestEventuallyStateReturnsTheLastState(t *testing.T) {
	n := 0
	held, state := EventuallyState(20*time.Millisecond, func() (bool, string) { n++; return false, strconv.Itoa(n) })
	if held || state != strconv.Itoa(n) {
		t.Fatalf("EventuallyState of a condition that never holds = %v, %q; want false, %q (the last call's)", held, state, strconv.Itoa(n))
	}
	held, state = EventuallyState(time.Second, func() (bool, string) { return true, "done" })
	if !held || state != "done" {
		t.Fatalf("EventuallyState of a condition that holds = %v, %q; want true, done", held, state)
	}
}

func TestHasSeries(t *testing.T) {
	body := "# TYPE x counter\nkurz_calls_total{code=\"OK\",method=\"Get\"} 3\nkurz_calls 1\n"
	for _, c := range []struct {
		name string
		with []string
		want bool
	}{
		{"kurz_calls_total", []string{`code="OK"`}, true},
		{"kurz_calls_total", []string{`code="OK"`, `method="Put"`}, false},
		{"kurz_calls", nil, true},
		{"kurz_call", nil, false},
	} {
		if got := HasSeries(body, c.name, c.with...); got != c.want {
			t.Errorf("HasSeries(%s, %v) = %v, want %v", c.name, c.with, got, c.want)
		}
	}
}

func TestSeriesSum(t *testing.T) {
	body := "# TYPE x counter\nkurz_calls_total{code=\"OK\",method=\"Get\"} 3\nkurz_calls_total{code=\"OK\",method=\"Put\"} 2.5\n" +
		"kurz_calls_total{code=\"NotFound\",method=\"Get\"} 1\nkurz_calls 7\n"
	for _, c := range []struct {
		name  string
		with  []string
		want  float64
		found bool
	}{
		{"kurz_calls_total", []string{`code="OK"`}, 5.5, true},
		{"kurz_calls_total", []string{`method="Get"`}, 4, true},
		{"kurz_calls_total", []string{`code="OK"`, `method="Delete"`}, 0, false},
		{"kurz_calls", nil, 7, true},
		{"kurz_call", nil, 0, false},
	} {
		if got, found := SeriesSum(body, c.name, c.with...); got != c.want || found != c.found {
			t.Errorf("SeriesSum(%s, %v) = %v, %v; want %v, %v", c.name, c.with, got, found, c.want, c.found)
		}
	}
}
