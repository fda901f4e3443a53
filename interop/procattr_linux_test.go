//go:build linux

package interop

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel kill the state store if the test binary dies
// without stopping it (panic, -timeout), so no orphan keeps listening.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
