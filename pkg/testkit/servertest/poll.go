package servertest

import (
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
		return true
	}
	return false
}
