//go:build !race

package app

// raceEnabled: the test binary runs without the race detector.
const raceEnabled = false
