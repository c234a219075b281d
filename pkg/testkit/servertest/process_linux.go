package servertest

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the process when the test binary dies,
// so that a crashed or killed test leaves no service running on its ports.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
