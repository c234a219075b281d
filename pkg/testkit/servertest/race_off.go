//go:build !race

package servertest

// RaceEnabled: the test binary runs without the race detector.
const RaceEnabled = false
