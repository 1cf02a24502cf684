package sqlite

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// LockTimeoutError is returned by a write that waited Config.BusyTimeout
// for the processes' writer lock of the database file (an flock beside
// it) while another process held it: that process is stopped, hung
// mid-write, or much busier than the timeout allows. The write did not
// start: nothing of it is in the file.
type LockTimeoutError struct {
	// Path is the lock file.
	Path string
	// Waited is how long the write waited (Config.BusyTimeout).
	Waited time.Duration
}

func (e *LockTimeoutError) Error() string {
	return fmt.Sprintf("sqlite: another process held the writer lock %s for %v (Config.BusyTimeout); the write was not started", e.Path, e.Waited)
}

// writerLock queues the write transactions of one process on one file
// (turn, in Go) and then of the processes (the flock). The flock is taken
// by one goroutine at a time with a blocking call, so the holder of the
// turn is woken as soon as another process lets go; a writer that gives
// up (its context, or the busy timeout) leaves that call running, and the
// next writer waits for the same call instead of starting another: two
// calls on one open file would both succeed, and the first unlock would
// free the other's lock. A call that succeeds with no writer waiting
// unlocks at once.
type writerLock struct {
	turn chan struct{} // holds a token while a writer of the process has its turn
	file *fileLock

	mu       sync.Mutex
	inflight bool       // a flock call is running
	waiter   chan error // the writer waiting for that call, or nil
	closed   bool       // close was called: the call that ends closes the file
}

func newWriterLock(f *fileLock) *writerLock {
	return &writerLock{turn: make(chan struct{}, 1), file: f}
}

// lock takes the process's turn (waiting for ctx at most) and then the
// flock (waiting for ctx and busy at most). On success the caller calls
// unlock.
func (w *writerLock) lock(ctx context.Context, busy time.Duration) error {
	select {
	case w.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	ch := make(chan error, 1)
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.turn
		return fmt.Errorf("the writer lock file is closed")
	}
	w.waiter = ch
	if !w.inflight {
		w.inflight = true
		go w.take()
	}
	w.mu.Unlock()

	timer := time.NewTimer(busy)
	defer timer.Stop()
	var gaveUp error
	select {
	case err := <-ch:
		if err != nil {
			<-w.turn
			return fmt.Errorf("the writer lock file: %w", err)
		}
		return nil
	case <-ctx.Done():
		gaveUp = ctx.Err()
	case <-timer.C:
		gaveUp = &LockTimeoutError{Path: w.file.name(), Waited: busy}
	}
	w.mu.Lock()
	if w.waiter == ch {
		w.waiter = nil
		w.mu.Unlock()
	} else {
		// The call ended as this writer gave up: its result is in ch.
		w.mu.Unlock()
		if err := <-ch; err == nil {
			w.file.unlock()
		}
	}
	<-w.turn
	return gaveUp
}

// take runs one blocking flock call and hands its result to the writer
// waiting for it; with none, it lets the lock go at once.
func (w *writerLock) take() {
	err := w.file.lock()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inflight = false
	switch {
	case w.waiter != nil:
		w.waiter <- err
		w.waiter = nil
	case w.closed:
		w.file.close()
	case err == nil:
		w.file.unlock()
	}
}

// unlock ends the turn taken by a successful lock.
func (w *writerLock) unlock() {
	w.file.unlock()
	<-w.turn
}

// close closes the lock file once no writer has the turn; a flock call
// still running closes it when it ends.
func (w *writerLock) close() {
	w.turn <- struct{}{}
	w.mu.Lock()
	w.closed = true
	if !w.inflight {
		w.file.close()
	}
	w.mu.Unlock()
	<-w.turn
}
