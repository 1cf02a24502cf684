package faults

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes cmd's process get SIGKILL when the test process dies,
// even a panicking one.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
