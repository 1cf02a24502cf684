package faults

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/conformance/internal/casewatch"
)

// errRecorder is a casewatch.T that keeps the failures reported.
type errRecorder struct {
	mu     sync.Mutex
	errors []string
}

func (e *errRecorder) Helper()      {}
func (e *errRecorder) Name() string { return "TestFaults/Waits" }
func (e *errRecorder) Errorf(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.errors = append(e.errors, fmt.Sprintf(format, args...))
}
func (e *errRecorder) Logf(string, ...any) {}

// TestBoundedWaitsAreProgress: two bounded waits in a row, with nothing
// logged, outlast the idle deadline together but are not a stall (a
// scenario whose jobs did not all resolve is checked as it stands, never
// reported stalled and left running), while a case blocked outside a
// bounded wait still is.
func TestBoundedWaitsAreProgress(t *testing.T) {
	t.Parallel()
	const idle = 400 * time.Millisecond
	never := func() bool { return false }

	var polls atomic.Int64
	dir := t.TempDir()
	rec := &errRecorder{}
	r := &run{dir: dir, polls: &polls}
	casewatch.RunIdle(rec, time.Minute, idle, progress(dir, &polls), 5*time.Second, nil, func() {
		r.waitFor(300*time.Millisecond, never)
		r.waitFor(300*time.Millisecond, never)
	})
	if len(rec.errors) > 0 {
		t.Errorf("two bounded waits of %v each, idle deadline %v: reported %q", 300*time.Millisecond, idle, rec.errors)
	}

	var polls2 atomic.Int64
	rec = &errRecorder{}
	release := make(chan struct{})
	casewatch.RunIdle(rec, time.Minute, idle, progress(dir, &polls2), 5*time.Second, func() { close(release) }, func() {
		<-release
	})
	if len(rec.errors) == 0 {
		t.Errorf("a case blocked for good was not reported stalled")
	}
}

// TestRestartIsProgress: a broker's restart that logs nothing for longer
// than the idle deadline is not a stall, and a restart that ends without
// returning (t.FailNow in it) ends the wait with an error.
func TestRestartIsProgress(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	log, err := OpenLog(dir + "/parent.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	var polls atomic.Int64
	r := &run{dir: dir, polls: &polls, log: log}
	rec := &errRecorder{}
	var rerr error
	casewatch.RunIdle(rec, time.Minute, 400*time.Millisecond, progress(dir, &polls), 5*time.Second, nil, func() {
		rerr = r.restarted(func() error { time.Sleep(700 * time.Millisecond); return nil })
	})
	if len(rec.errors) > 0 || rerr != nil {
		t.Errorf("a restart of 700ms, idle deadline 400ms: reported %q, error %v", rec.errors, rerr)
	}
	if err := r.restarted(func() error { runtime.Goexit(); return nil }); err == nil {
		t.Errorf("a restart that ended without returning: no error")
	}
}
