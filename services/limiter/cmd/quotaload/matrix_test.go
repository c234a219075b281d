package main

import (
	"testing"
	"time"

	"kurz.dev/tools/loadgen"
)

func TestRatioCountsRedisAndCacheAnswersOnly(t *testing.T) {
	x := cell{
		evalsha: &loadgen.Result{N: 1000, Elapsed: time.Second},
		quota: &loadgen.Result{N: 1000, Elapsed: time.Second, Tags: map[string]int{
			"allowed": 100, "denied": 200, "over_limit_cache/denied": 600, "fail_open/allowed": 100}},
	}
	if got := x.share(fromRedis); got != 0.3 {
		t.Errorf("share from Redis %v, want 0.3", got)
	}
	if got := x.share(fromCache); got != 0.6 {
		t.Errorf("share from the cache %v, want 0.6", got)
	}
	if got := x.ratio(); got < 0.899 || got > 0.901 {
		t.Errorf("ratio %v, want 0.9 (fail-open answers left out)", got)
	}
}
