package casewatch

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder is a T that keeps what a Run reports.
type recorder struct {
	mu     sync.Mutex
	name   string
	errors []string
	logs   []string
}

func (r *recorder) Helper()      {}
func (r *recorder) Name() string { return r.name }
func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *recorder) Logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

// waitHere is a function the stalled case's goroutines block in, so the
// dump can be checked for it.
func waitHere(ch <-chan struct{}) { <-ch }

func TestStalledCaseNamedWithItsStacks(t *testing.T) {
	r := &recorder{name: "TestConformance/Crash/Stalls"}
	release := make(chan struct{})
	aborted := false
	start := time.Now()
	Run(r, 200*time.Millisecond, 5*time.Second, func() { aborted = true; close(release) }, func() {
		go waitHere(release) // a goroutine the case started inherits its label
		waitHere(release)
	})
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Run returned %v after a stall, with a deadline of 200ms", took)
	}
	if !aborted {
		t.Errorf("abort was not called")
	}
	if len(r.errors) != 1 {
		t.Fatalf("errors %q, want one", r.errors)
	}
	e := r.errors[0]
	for _, want := range []string{"STALLED", "TestConformance/Crash/Stalls", "200ms", "casewatch.waitHere", `"` + Label + `":"TestConformance/Crash/Stalls"`} {
		if !strings.Contains(e, want) {
			t.Errorf("the failure does not say %q:\n%s", want, e)
		}
	}
	if strings.Contains(e, "testing.tRunner") || strings.Count(e, "# labels:") != 2 {
		t.Errorf("the dump shows goroutines that are not the case's:\n%s", e)
	}
	if len(r.logs) != 1 || !strings.Contains(r.logs[0], "ended within") {
		t.Errorf("logs %q, want the case's end after the abort", r.logs)
	}
}

func TestLeftBehindAfterGrace(t *testing.T) {
	r := &recorder{name: "TestX/Stuck"}
	stuck := make(chan struct{})
	defer close(stuck)
	start := time.Now()
	Run(r, 50*time.Millisecond, 100*time.Millisecond, nil, func() { waitHere(stuck) })
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Run returned %v after a stall that abort does not end", took)
	}
	if len(r.errors) != 2 || !strings.Contains(r.errors[1], "left behind") {
		t.Errorf("errors %q, want the stall and the case left behind", r.errors)
	}
}

func TestFinishedCaseSaysNothing(t *testing.T) {
	r := &recorder{name: "TestX/Fine"}
	ran := false
	Run(r, time.Minute, time.Second, func() { t.Error("abort called for a case that finished") }, func() { ran = true })
	if !ran || len(r.errors)+len(r.logs) > 0 {
		t.Errorf("ran %v, errors %q, logs %q", ran, r.errors, r.logs)
	}
}

func TestIdleCaseNamed(t *testing.T) {
	r := &recorder{name: "TestFaults/KillMidJob"}
	release := make(chan struct{})
	start := time.Now()
	RunIdle(r, time.Minute, 200*time.Millisecond, func() int64 { return 7 }, 5*time.Second, func() { close(release) }, func() {
		waitHere(release)
	})
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("RunIdle returned %v after a case that made no progress, with an idle deadline of 200ms and a deadline of a minute", took)
	}
	if len(r.errors) != 1 {
		t.Fatalf("errors %q, want one", r.errors)
	}
	for _, want := range []string{"STALLED", "TestFaults/KillMidJob", "no progress", "stayed at 7", "casewatch.waitHere"} {
		if !strings.Contains(r.errors[0], want) {
			t.Errorf("the failure does not say %q:\n%s", want, r.errors[0])
		}
	}
}

func TestProgressKeepsCaseAlive(t *testing.T) {
	r := &recorder{name: "TestFaults/PoisonIsolation"}
	var (
		mu sync.Mutex
		n  int64
	)
	progress := func() int64 { mu.Lock(); defer mu.Unlock(); return n }
	RunIdle(r, time.Hour, 2*time.Second, progress, 5*time.Second, nil, func() {
		// Works for one and a half idle deadlines, moving every hundredth
		// of one.
		for range 150 {
			time.Sleep(20 * time.Millisecond)
			mu.Lock()
			n++
			mu.Unlock()
		}
	})
	if len(r.errors) != 0 {
		t.Errorf("a case that kept making progress failed: %q", r.errors)
	}
}
