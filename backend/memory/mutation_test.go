package memory_test

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/conformance"
	"github.com/asyncplatform/asyncplatform/conformance/faults"
	"github.com/asyncplatform/asyncplatform/driver"
)

// mutantEnv makes TestOverMaxMutant its own child: the suites against the
// memory backend broken by overMax.
const mutantEnv = "ASYNCPLATFORM_MEMORY_MUTANT"

// overMax is the memory backend broken in one rule of driver.Backend:
// Receive hands out one message more than max when it can. A platform
// over it holds more deliveries than it has room for, which used to leave
// the conformance and fault suites hanging, silent, until go test's
// -timeout.
type overMax struct{ *memory.Backend }

func (b overMax) Receive(ctx context.Context, queue string, max int, lease time.Duration) ([]*driver.Delivery, error) {
	return b.Backend.Receive(ctx, queue, max+1, lease)
}

type overMaxHarness struct{ broker *memory.Broker }

func (h overMaxHarness) MakeBackend(ctx context.Context) (driver.Backend, error) {
	b, err := memory.New(ctx, memory.Config{Broker: h.broker, DeadHold: time.Second})
	if err != nil {
		return nil, err
	}
	return overMax{b}, nil
}
func (overMaxHarness) Close() {}

// overMaxSuites runs the suites on overMax: TestOverMaxMutant in its
// child process.
func overMaxSuites(t *testing.T) {
	t.Run("Conformance", func(t *testing.T) {
		t.Parallel()
		conformance.Run(t, func(context.Context, *testing.T) (conformance.Harness, error) {
			return overMaxHarness{memory.NewBroker()}, nil
		}, conformance.Options{
			Wait:          5 * time.Second, // the memory backend answers in microseconds
			SingleProcess: "the memory broker lives inside one process",
		})
	})
	t.Run("Faults", func(t *testing.T) {
		t.Parallel()
		broker := memory.NewBroker()
		faults.Run(t, faults.Target{
			Name:      "memory-overmax",
			Lease:     500 * time.Millisecond, // the default Deadline and Idle: a stall must show within two minutes of them
			InProcess: "the memory broker lives in the test process",
			Open: func(ctx context.Context, _ string) (driver.Backend, error) {
				b, err := memory.New(ctx, memory.Config{Broker: broker})
				if err != nil {
					return nil, err
				}
				return overMax{b}, nil
			},
		})
	})
}

// failedCase is the line go test prints for a failed case of the child.
var failedCase = regexp.MustCompile(`--- FAIL: TestOverMaxMutant/(\S+)`)

// TestOverMaxMutant runs the conformance and fault suites against the
// memory backend broken so that Receive hands out max+1, in a child process,
// and requires that they fail, naming the cases, well within two minutes
// each, with the whole report printed: no stalled case hangs the binary.
func TestOverMaxMutant(t *testing.T) {
	if os.Getenv(mutantEnv) != "" {
		overMaxSuites(t)
		return
	}
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: the mutant runs the suites in a child process")
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	// The cases of the rule, the Crash group, and the fault scenarios in
	// which workers die holding deliveries (where a platform holds more
	// than it has room for).
	run := "^TestOverMaxMutant$/^(Conformance|Faults)$/^(Delivery|Crash|KillMidJob|PoisonJob|PoisonIsolation|SigtermMidJob)$"
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+run, "-test.count=1", "-test.parallel=8", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), mutantEnv+"=1", conformance.LoadEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	took := time.Since(start)
	var failed []string
	sc := bufio.NewScanner(bytes.NewReader(out.Bytes()))
	for sc.Scan() {
		if f := failedCase.FindStringSubmatch(sc.Text()); f != nil && strings.Count(f[1], "/") >= 1 && !slices.Contains(failed, f[1]) {
			failed = append(failed, f[1])
		}
	}
	t.Logf("the child ran %v and failed: %s", took.Round(time.Second), strings.Join(failed, ", "))
	if strings.Contains(out.String(), "panic: test timed out") || ctx.Err() != nil {
		t.Fatalf("the suites hung on the mutant until the child's timeout:\n%s", tail(out.String(), 8000))
	}
	if err == nil || len(failed) == 0 {
		t.Fatalf("the suites passed a backend whose Receive hands out max+1 (%v):\n%s", err, tail(out.String(), 8000))
	}
	if !slices.Contains(failed, "Conformance/Delivery/ReceiveBatch") {
		t.Errorf("Delivery/ReceiveBatch, the case of the rule, did not fail")
	}
	// A scenario that stalls must be caught by the fault suite's idle
	// deadline (no progress for 100 s), not its 4-minute one: within two
	// minutes of the stall.
	for _, s := range regexp.MustCompile(`STALLED: case (\S+) ([^:]*)`).FindAllStringSubmatch(out.String(), -1) {
		t.Logf("stalled, named and dumped: %s %s", s[1], s[2])
		if strings.Contains(s[1], "Faults/") && !strings.Contains(s[2], "no progress") {
			t.Errorf("the fault scenario %s was caught by its overall deadline (%s), not by its idle deadline", s[1], s[2])
		}
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "...\n" + s[len(s)-n:]
}
