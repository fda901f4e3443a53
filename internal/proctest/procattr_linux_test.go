package proctest

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel kill a process the test started if the test
// binary dies without stopping it (a panic, -timeout), so that no store
// keeps listening and no candidate keeps campaigning.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
