//go:build unix

package sqlite

import (
	"fmt"
	"os"
	"syscall"
)

// fileLock is the writer lock the processes on one database file share: an
// flock on a file beside it. SQLite's own busy handler polls with sleeps
// of up to 100ms, so a process whose writers follow one another closely
// would starve the others; a process blocked on the flock is woken as soon
// as it is released.
type fileLock struct{ f *os.File }

func openFileLock(path string) (*fileLock, error) {
	f, err := os.OpenFile(path+"-writer.lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sqlite: the writer lock file: %w", err)
	}
	return &fileLock{f: f}, nil
}

func (l *fileLock) lock() error {
	for {
		err := syscall.Flock(int(l.f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			return err
		}
	}
}

func (l *fileLock) unlock() { _ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN) }

func (l *fileLock) close() { l.f.Close() }

func (l *fileLock) name() string { return l.f.Name() }
