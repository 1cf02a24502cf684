//go:build !linux

package faults

import "os/exec"

// dieWithParent does nothing here: child workers still exit when their
// stdin closes, and brokers are killed by the test's cleanup.
func dieWithParent(*exec.Cmd) {}
