//go:build unix

package dirstore

import (
	"errors"
	"syscall"
)

// openFlags open a file without following a symbolic link, and without
// waiting on a FIFO swapped in for a payload.
const openFlags = syscall.O_NOFOLLOW | syscall.O_NONBLOCK

// isLoop reports whether an open with openFlags failed on a symbolic link.
func isLoop(err error) bool {
	return errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.EMLINK)
}
