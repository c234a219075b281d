//go:build race

package app

// raceEnabled: the test binary runs under the race detector, and so do the
// service processes it builds.
const raceEnabled = true
