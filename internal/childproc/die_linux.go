//go:build linux

package childproc

import (
	"os/exec"
	"syscall"
)

// DieWithParent has the kernel kill the child when the parent dies, so a
// parent killed mid-test leaves no worker behind.
func DieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
