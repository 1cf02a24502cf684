//go:build unix

package sqlite

import (
	"context"
	"errors"
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

	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want func(error) bool
	}{
		{"its context ends", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 100*time.Millisecond)
		}, func(err error) bool { return errors.Is(err, context.DeadlineExceeded) }},
		{"the busy timeout", func() (context.Context, context.CancelFunc) {
			return context.WithCancel(context.Background())
		}, func(err error) bool {
			var e *LockTimeoutError
			return errors.As(err, &e) && e.Waited == 500*time.Millisecond
		}},
	} {
		ctx, cancel := tc.ctx()
		done := make(chan error, 1)
		go func() { done <- b.Enqueue(ctx, "lockwait", []driver.Message{{Body: []byte("x")}}) }()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("%s: Enqueue succeeded while another process held the writer lock", tc.name)
			} else if !tc.want(err) {
				t.Errorf("%s: Enqueue failed with %v, not the error expected", tc.name, err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s: Enqueue still waiting for the writer lock 20s later (BusyTimeout 500ms)", tc.name)
		}
		cancel()
	}

	// The other process lets go: the abandoned waits left no lock behind,
	// the next write goes through, and the failed ones wrote nothing.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.Enqueue(ctx, "lockwait", []driver.Message{{Body: []byte("y")}}); err != nil {
		t.Fatalf("Enqueue once the lock was free: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("the writer lock is still held after the write: %v", err)
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	st, err := b.Stats(ctx, "lockwait")
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 1 {
		t.Errorf("Stats after two failed writes and one good one: %d ready, want 1", st.Ready)
	}
}
