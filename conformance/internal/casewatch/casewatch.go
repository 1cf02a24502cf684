// Package casewatch runs a test case of the conformance suites under a
// deadline of its own, so that a case that stalls fails, named, with what
// it was waiting for, instead of hanging the test binary until go test's
// -timeout kills it and prints nothing of the report.
//
// The case runs in a goroutine of its own that carries a pprof label with
// the case's name; every goroutine it starts (a platform's fetchers and
// handlers, a background Receive) inherits the label, so the stacks of
// exactly the case's goroutines can be told from the rest of the suite's.
package casewatch

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Label is the pprof label key that names the case a goroutine works for.
const Label = "asyncplatform-conformance-case"

// MaxDump bounds the stacks a stalled case's failure shows, in bytes.
const MaxDump = 64 << 10

// T is the part of *testing.T that Run uses.
type T interface {
	Helper()
	Name() string
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
}

var _ T = (*testing.T)(nil)

// Run runs body, the case t, in a goroutine of its own and waits for it.
// When body has not returned within limit, Run fails t with the case's name,
// the limit, and the stacks of the goroutines labelled with the case, then
// calls abort (which ends what the case can be waiting on: its backends;
// nil for none)
// and waits up to grace more. A case still running then is left behind and
// Run returns, so that the test ends and the rest of the report prints; the
// panic of its goroutine's later t.Errorf, t.Fatal or t.Log (its test has
// completed) is recovered and dropped, not left to end the test binary.
// Goroutines the case started are not covered.
//
// body may call t.Fatal, t.Skip and the like: they end body's goroutine,
// which ends the wait.
func Run(t T, limit, grace time.Duration, abort func(), body func()) {
	t.Helper()
	RunIdle(t, limit, 0, nil, grace, abort, body)
}

// RunIdle is Run with a second deadline: when progress (a figure that
// grows while the case works, such as the bytes its workers have logged)
// has not changed for idle, the case has stalled, however long it may run
// in all. Progress is read every idle/100 (at least every 10ms).
func RunIdle(t T, limit, idle time.Duration, progress func() int64, grace time.Duration, abort func(), body func()) {
	t.Helper()
	done := make(chan struct{})
	var left atomic.Bool // Run has returned with body still running
	go func() {
		defer close(done)
		defer func() {
			if !left.Load() {
				return
			}
			// A case left behind outlives its test: testing panics at its
			// next Errorf, Fatalf or Log, which would end the whole binary
			// and lose the rest of the report. Its stall is reported
			// already; the late call is dropped.
			if p := recover(); p != nil {
				if s, ok := p.(string); !ok || !strings.Contains(s, " has completed") {
					panic(p)
				}
			}
		}()
		pprof.Do(context.Background(), pprof.Labels(Label, t.Name()), func(context.Context) { body() })
	}()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	var tick <-chan time.Time
	if idle > 0 && progress != nil {
		tk := time.NewTicker(max(idle/100, 10*time.Millisecond))
		defer tk.Stop()
		tick = tk.C
	}
	var seen int64
	if progress != nil {
		seen = progress()
	}
	moved := time.Now()
	why := fmt.Sprintf("had not finished %v after it began (its deadline)", limit)
wait:
	for {
		select {
		case <-done:
			return
		case <-timer.C:
			break wait
		case now := <-tick:
			if p := progress(); p != seen {
				seen, moved = p, now
			} else if now.Sub(moved) >= idle {
				why = fmt.Sprintf("had made no progress for %v (its idle deadline; its progress figure stayed at %d)", now.Sub(moved).Round(time.Second), seen)
				break wait
			}
		}
	}
	t.Errorf("STALLED: case %s %s: it fails. "+
		"Its goroutines, and what each was waiting for:\n%s", t.Name(), why, Stacks(t.Name()))
	if abort != nil {
		abort()
	}
	select {
	case <-done:
		t.Logf("case %s ended within %v after its deadline", t.Name(), grace)
	case <-time.After(grace):
		left.Store(true)
		t.Errorf("case %s was still running %v after its deadline: its goroutine is left behind so that the report prints", t.Name(), grace)
	}
}

// Stacks returns the stacks of the goroutines labelled with the case name,
// grouped as runtime/pprof's goroutine profile groups them (debug=1), at
// most MaxDump bytes.
func Stacks(name string) string {
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		return fmt.Sprintf("(no goroutine profile: %v)", err)
	}
	want := fmt.Sprintf("%q:%q", Label, name)
	var out strings.Builder
	n := 0
	for _, rec := range strings.Split(buf.String(), "\n\n") {
		if !strings.Contains(rec, want) {
			continue
		}
		n++
		if out.Len()+len(rec) > MaxDump {
			fmt.Fprintf(&out, "(more stacks left out: the dump is bounded to %d bytes)\n", MaxDump)
			break
		}
		out.WriteString(rec)
		out.WriteString("\n\n")
	}
	if n == 0 {
		return "(no goroutine of the case is left: it is stuck in a goroutine it did not start, or in its cleanup)"
	}
	return out.String()
}
