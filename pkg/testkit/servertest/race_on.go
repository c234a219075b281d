//go:build race

package servertest

// RaceEnabled: the test binary runs under the race detector, and so do the
// service binaries BuildServices builds for it.
const RaceEnabled = true
