//go:build integration

package faults

import (
	"context"
	"slices"
	"sync"
	"time"
)

// sample is one request made under a fault.
type sample struct {
	at      time.Time // when it was sent
	latency time.Duration
	err     error
	tag     string // what the request was (e.g. a rule's failure mode)
	outcome string // how it was answered (e.g. a decision source, a status)
	ok      bool   // allowed / served
}

// steadyLoad runs workers, each calling call back to back, until stop; it
// returns every sample in send order. Stop lets the calls in flight finish,
// so every request the services saw has its sample.
type steadyLoad struct {
	mu      sync.Mutex
	samples []sample
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func startLoad(workers int, call func(ctx context.Context, worker, i int) sample) *steadyLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &steadyLoad{cancel: cancel}
	for w := range workers {
		l.wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				at := time.Now()
				s := call(context.Background(), w, i)
				s.at, s.latency = at, time.Since(at)
				l.mu.Lock()
				l.samples = append(l.samples, s)
				l.mu.Unlock()
			}
		})
	}
	return l
}

// count is how many samples were recorded so far.
func (l *steadyLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.samples)
}

// stop ends the load and returns its samples in send order.
func (l *steadyLoad) stop() []sample {
	l.cancel()
	l.wg.Wait()
	slices.SortFunc(l.samples, func(a, b sample) int { return a.at.Compare(b.at) })
	return l.samples
}

// awaitSamples waits until the load recorded n more samples than now.
func (l *steadyLoad) awaitSamples(n int, timeout time.Duration) bool {
	want := l.count() + n
	deadline := time.Now().Add(timeout)
	for l.count() < want {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond) // the load has no per-sample signal
	}
	return true
}

// quantile of the samples' latencies (0..1).
func quantile(samples []sample, q float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	l := make([]time.Duration, len(samples))
	for i, s := range samples {
		l[i] = s.latency
	}
	slices.Sort(l)
	return l[int(q*float64(len(l)-1))]
}

func maxLatency(samples []sample) time.Duration {
	var m time.Duration
	for _, s := range samples {
		m = max(m, s.latency)
	}
	return m
}

// between returns the samples sent in [from, to).
func between(samples []sample, from, to time.Time) []sample {
	var out []sample
	for _, s := range samples {
		if !s.at.Before(from) && s.at.Before(to) {
			out = append(out, s)
		}
	}
	return out
}
