package servertest

import (
	"iter"
	"strconv"
	"strings"
	"time"
)

// Eventually polls cond every 5 ms until it holds (true) or within has
// passed (false): how tests wait for something asynchronous, instead of
// sleeping for a guessed time.
func Eventually(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// EventuallyState is Eventually for a condition that also describes the
// state it saw, and returns the last description: for the failure message
// of a test that waited in vain.
func EventuallyState(within time.Duration, cond func() (bool, string)) (bool, string) {
	var state string
	held := Eventually(within, func() bool {
		var ok bool
		ok, state = cond()
		return ok
	})
	return held, state
}

// HasSeries reports whether the Prometheus text body has a sample of name
// whose labels include every string of with (e.g. `code="OK"`).
func HasSeries(body, name string, with ...string) bool {
	for range samples(body, name, with) {
		return true
	}
	return false
}

// SeriesSum is the sum of the samples of name in the Prometheus text body
// whose labels include every string of with (HasSeries's match), and
// whether there was one: a counter summed over the labels a test does not
// fix (a decision's source, say).
func SeriesSum(body, name string, with ...string) (float64, bool) {
	var sum float64
	found := false
	for line := range samples(body, name, with) {
		line = strings.TrimSpace(line)
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
			sum, found = sum+v, true
		}
	}
	return sum, found
}

// samples are the lines of body that are samples of name with every
// string of with in them.
func samples(body, name string, with []string) iter.Seq[string] {
	return func(yield func(string) bool) {
	lines:
		for line := range strings.Lines(body) {
			if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
				continue
			}
			for _, w := range with {
				if !strings.Contains(line, w) {
					continue lines
				}
			}
			if !yield(line) {
				return
			}
		}
	}
}
