//go:build unix && !linux

package pgtest

import (
	"syscall"
	"time"
)

// procAttr runs the postmaster as cred (nil: as the test), in a process
// group of its own.
func procAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true}
}

// crash kills the postmaster pid and its process group. Server processes
// that called setsid may outlive it a moment; start tries again while they
// hold the shared memory.
func crash(pid int, _ time.Duration) {
	_ = syscall.Kill(pid, syscall.SIGKILL)
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}
