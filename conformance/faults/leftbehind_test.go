package faults

import (
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/conformance/internal/casewatch"
)

// leftBehindEnv makes TestLeftBehindCaseChild run (in a child process).
const leftBehindEnv = "ASYNCPLATFORM_FAULTS_LEFTBEHIND_CHILD"

// TestLeftBehindCaseDoesNotPanic: bounded waits in a row, each of them
// progress, can still add up past a scenario's Deadline (BrokerKill: a
// restart bounded by 30 s and a 90 s boot, waitResolved and quiesce a
// patience each, against a Deadline of two patiences and a minute). The
// case is then reported STALLED by its Deadline and its goroutine left
// behind, and that goroutine's next t.Errorf, after its test has
// completed, panics the whole test binary: the failure of stop 51's CI,
// reached through the Deadline instead of the idle deadline. The case
// runs in a child process so that the panic does not end this binary.
func TestLeftBehindCaseDoesNotPanic(t *testing.T) {
	if os.Getenv(leftBehindEnv) != "" {
		t.Skip("the child runs TestLeftBehindCaseChild")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLeftBehindCaseChild$", "-test.v")
	cmd.Env = append(os.Environ(), leftBehindEnv+"=1")
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "STALLED") {
		t.Fatalf("the child's case was not reported stalled:\n%s", out)
	}
	if strings.Contains(string(out), "panic:") {
		t.Errorf("a case left behind by its Deadline panicked the test binary:\n%s", out)
	}
}

// TestLeftBehindCaseChild is TestLeftBehindCaseDoesNotPanic's child: it
// fails (STALLED) by design, and runs only in the child.
func TestLeftBehindCaseChild(t *testing.T) {
	if os.Getenv(leftBehindEnv) == "" {
		t.Skip("run by TestLeftBehindCaseDoesNotPanic in a child process")
	}
	never := func() bool { return false }
	t.Run("BrokerKill", func(t *testing.T) {
		dir := t.TempDir()
		var polls atomic.Int64
		r := &run{t: t, dir: dir, polls: &polls}
		// Deadline 700ms, idle 400ms: three bounded waits of 300ms, each
		// progress, outlast the Deadline together.
		casewatch.RunIdle(t, 700*time.Millisecond, 400*time.Millisecond, progress(dir, &polls), 100*time.Millisecond, nil, func() {
			r.waitFor(300*time.Millisecond, never)                     // the restart
			r.waitFor(300*time.Millisecond, never)                     // waitResolved
			r.waitFor(300*time.Millisecond, never)                     // quiesce
			r.t.Errorf("draining dead letters: the backend is closed") // finish, on a backend the test's cleanup closed
		})
	})
	time.Sleep(2 * time.Second) // the parent test (TestFaults) runs on
}
