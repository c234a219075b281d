package main

import (
	"strings"
	"testing"
	"time"

	"kurz.dev/tools/loadgen"
)

func TestTargetsSayMetOrMissed(t *testing.T) {
	quick := loadgen.Closed("quick", 1, 20*time.Millisecond, func(int) (string, error) { return "l1", nil })
	fixed := &server{name: "net/http fixed 302"}
	node := &server{name: "Node prototype"}
	kurz := &server{name: "kurz redirect", kurz: true, rounds: []*loadgen.Result{quick}}
	failing := &server{name: "kurz redirect, failing", kurz: true, rounds: []*loadgen.Result{{N: 10, Errors: 1, Elapsed: time.Second}}}
	var out strings.Builder
	targets(&out, []*server{fixed, node, kurz, failing}, []versus{
		{kurz: kurz, peer: fixed, throughput: 0.79, cpu: 1.43},
		{kurz: kurz, peer: node, throughput: 1.72},
		{kurz: failing, peer: fixed, throughput: nan, cpu: nan},
	})
	for _, want := range []string{
		"| kurz redirect: requests/s ≥ 0.7× net/http fixed 302 | 0.79 x | met |",
		"| kurz redirect: server CPU per request ≤ 1.3× net/http fixed 302's | 1.43 x | missed |",
		"| kurz redirect: requests/s ≥ 1.0× Node prototype | 1.72 x | met |",
		"| kurz redirect, failing: requests/s ≥ 0.7× net/http fixed 302 | – | missed |",
		"| kurz redirect, failing: p99 ≤ 5 ms | – | missed |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("targets lack %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(out.String(), "| kurz redirect: p99 ≤ 5 ms | 0.0") {
		t.Errorf("a quick kurz's p99 not met:\n%s", out.String())
	}
}
