//go:build !linux

package childproc

import "os/exec"

// DieWithParent does nothing on this system: only Linux has the signal.
func DieWithParent(*exec.Cmd) {}
