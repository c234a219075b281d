// Package loadgen drives a call at a fixed concurrency (closed loop) or at a
// fixed rate (open loop) and reports throughput and latency percentiles.
// Open-loop latency is measured from each call's scheduled start, so a
// stalled server shows up in the percentiles instead of slowing the load
// down (no coordinated omission).
package loadgen

import (
	"fmt"
	"io"
	"slices"
	"sync"
	"time"
)

// Call makes one request; worker is the caller's index. A non-nil error
// counts as an error; tag (may be "") is counted per value, e.g. how a
// request was served.
type Call func(worker int) (tag string, err error)

// Result is one measurement. N, Rate, the quantiles and Tags count only
// the calls answered without error: a target failing fast must not look
// fast. Errors counts the others.
type Result struct {
	Name      string
	N, Errors int
	Tags      map[string]int
	Elapsed   time.Duration
	latencies []time.Duration
}

// Rate is calls answered without error per second.
func (r *Result) Rate() float64 { return float64(r.N) / r.Elapsed.Seconds() }

// Quantile returns the q-quantile (0..1) of the latencies.
func (r *Result) Quantile(q float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	slices.Sort(r.latencies)
	return r.latencies[int(q*float64(len(r.latencies)-1))]
}

// Print writes one line: rate, p50, p99, p99.9, errors and tags.
func (r *Result) Print(w io.Writer) {
	fmt.Fprintf(w, "%-40s %9.0f/s  p50 %-9v p99 %-9v p99.9 %-9v errors %d", r.Name, r.Rate(),
		r.Quantile(0.5).Round(time.Microsecond), r.Quantile(0.99).Round(time.Microsecond),
		r.Quantile(0.999).Round(time.Microsecond), r.Errors)
	if len(r.Tags) > 0 {
		fmt.Fprintf(w, " %v", r.Tags)
	}
	fmt.Fprintln(w)
}

// Merge combines measurements of the same thing (rounds of one run) into
// one named name: calls, errors and tags add up, the latencies are pooled
// and the elapsed times add, so Rate is the calls of all rounds over the
// time they took together.
func Merge(name string, rs ...*Result) *Result {
	m := &Result{Name: name, Tags: map[string]int{}}
	for _, r := range rs {
		m.N += r.N
		m.Errors += r.Errors
		m.Elapsed += r.Elapsed
		for k, v := range r.Tags {
			m.Tags[k] += v
		}
		m.latencies = append(m.latencies, r.latencies...)
	}
	return m
}

// Closed runs concurrency workers, each calling back to back, for d.
func Closed(name string, concurrency int, d time.Duration, call Call) *Result {
	stop := time.Now().Add(d)
	return run(name, concurrency, func(worker int, record func(time.Duration, string, error)) {
		for time.Now().Before(stop) {
			t0 := time.Now()
			tag, err := call(worker)
			record(time.Since(t0), tag, err)
		}
	})
}

// Open schedules rate calls per second for d, spread over concurrency
// workers; each latency counts from the call's scheduled start.
func Open(name string, rate float64, concurrency int, d time.Duration, call Call) *Result {
	interval := time.Duration(float64(time.Second) / rate)
	total := int(d / interval)
	sched := make(chan time.Time, total)
	start := time.Now()
	for i := range total {
		sched <- start.Add(time.Duration(i) * interval)
	}
	close(sched)
	return run(name, concurrency, func(worker int, record func(time.Duration, string, error)) {
		for at := range sched {
			if wait := time.Until(at); wait > 0 {
				time.Sleep(wait)
			}
			tag, err := call(worker)
			record(time.Since(at), tag, err)
		}
	})
}

func run(name string, concurrency int, work func(worker int, record func(time.Duration, string, error))) *Result {
	total := &Result{Name: name, Tags: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for w := range concurrency {
		wg.Go(func() {
			local := &Result{Tags: map[string]int{}}
			work(w, func(lat time.Duration, tag string, err error) {
				if err != nil {
					local.Errors++
					return
				}
				local.latencies = append(local.latencies, lat)
				local.N++
				if tag != "" {
					local.Tags[tag]++
				}
			})
			mu.Lock()
			total.N += local.N
			total.Errors += local.Errors
			for k, v := range local.Tags {
				total.Tags[k] += v
			}
			total.latencies = append(total.latencies, local.latencies...)
			mu.Unlock()
		})
	}
	wg.Wait()
	total.Elapsed = time.Since(start)
	return total
}

// Targets is a markdown table of targets, each with a run's figure and
// whether the run met it: how the bench tools state what they measure.
type Targets struct{ rows [][3]string }

// Add adds a target, the run's figure for it, and whether it was met.
func (t *Targets) Add(target, figure string, met bool) {
	t.rows = append(t.rows, [3]string{target, figure, Verdict(met)})
}

// Write writes title and the table.
func (t *Targets) Write(w io.Writer, title string) {
	fmt.Fprintf(w, "\n%s\n\n| target | this run | |\n|---|---:|---|\n", title)
	for _, r := range t.rows {
		fmt.Fprintf(w, "| %s | %s | %s |\n", r[0], r[1], r[2])
	}
}

// Verdict says whether a target was met.
func Verdict(met bool) string {
	if met {
		return "met"
	}
	return "missed"
}
