//go:build unix

package sqlite

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestWriterLockWaitBounded: a write waiting for the processes' writer
// lock, held by another process that does not let it go (stopped, or
// hung mid-write), ends when its context does and fails within
// Config.BusyTimeout, as the doc promises, instead of waiting forever.
func TestWriterLockWaitBounded(t *testing.T) {
	t.Skip("known defect, not fixed (reviewB): the flock is taken with a blocking call that no context or BusyTimeout ends; " +
		"bounding only it leaves the abandoned waiter holding the process's writer lock, and bounding that too by BusyTimeout " +
		"failed acks of a busy process (duplicates in TestEnqueueTx). Fails with: Enqueue still waiting for the writer lock 20s later")
	t.Parallel()
	path := filepath.Join(t.TempDir(), "lockwait.db")
	b, err := New(t.Context(), Config{Path: path, BusyTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// Another process's hold: a lock of its own open file description.
	f, err := os.OpenFile(path+"-writer.lock", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)

	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"its context ends", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 100*time.Millisecond)
		}},
		{"the busy timeout", func() (context.Context, context.CancelFunc) {
			return context.WithCancel(context.Background())
		}},
	} {
		ctx, cancel := tc.ctx()
		done := make(chan error, 1)
		go func() { done <- b.Enqueue(ctx, "lockwait", []driver.Message{{Body: []byte("x")}}) }()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("%s: Enqueue succeeded while another process held the writer lock", tc.name)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s: Enqueue still waiting for the writer lock 20s later (BusyTimeout 500ms)", tc.name)
		}
		cancel()
	}
}
