//go:build !linux

package servertest

import "os/exec"

// dieWithParent is Linux-only (Pdeathsig): elsewhere a crashed test binary
// can leave its services running.
func dieWithParent(*exec.Cmd) {}
