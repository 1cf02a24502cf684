package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// Ctrl-C (SIGINT) sent to a real asyncctl process while it redrives 30
// dead letters at 10 a second, on each broker: it stops between two
// chunks, exits 130 and says how many it redrove; the redriven jobs and
// the dead letters left are the 30 seeded jobs, each exactly once. Run
// again, it redrives the rest.
func TestSIGINTRedrive(t *testing.T) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			rawURL := s.url(t)
			if driver.Lookup(s.scheme) == nil {
				testenv.Unreachable(t, s.name, fmt.Errorf("no backend registers %s://", s.scheme))
			}
			reachable(t, s.name, rawURL)
			queue := newQueue(t, rawURL)
			all := seedDead(t, rawURL, queue, 30)

			bin := binary(t)                                                      // built before the safety net starts: a build under load can take a minute
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a safety net
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "dead", "redrive", "--queue", queue, "--all", "--rate", "10")
			cmd.Env = append(os.Environ(), urlEnv+"="+rawURL)
			var out, errOut bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errOut
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Once the first chunk of 10 is redriven, the process waits a
			// second before the next: interrupt it then, or during the
			// next chunk.
			for {
				if st := stats(t, rawURL, queue); st.Ready >= 10 {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("the first chunk was not redriven: %s", errOut.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err := cmd.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
			err := cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != exitInterrupted {
				t.Fatalf("exit: %v, want %d\nstdout:\n%s\nstderr:\n%s", err, exitInterrupted, out.String(), errOut.String())
			}
			m := regexp.MustCompile(`^redrove (\d+) of 30 dead letters to queue "` + queue + `"\n$`).FindStringSubmatch(out.String())
			if m == nil || !bytes.Contains(errOut.Bytes(), []byte("interrupted: redrove "+m[1]+" of 30")) {
				t.Fatalf("stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
			}
			n, _ := strconv.Atoi(m[1])
			if n < 10 || n >= 30 || n%10 != 0 {
				t.Fatalf("redrove %d: want whole chunks of 10, and not all 30", n)
			}
			dead := deadIDs(t, rawURL, queue)
			slices.Sort(dead)
			ready := drain(t, rawURL, queue)
			if len(ready) != n || len(dead) != 30-n {
				t.Fatalf("redrove %d, but %d jobs are ready and %d dead letters left", n, len(ready), len(dead))
			}
			if got := slices.Sorted(slices.Values(append(ready, dead...))); !slices.Equal(got, all) {
				t.Fatalf("the redriven jobs and the dead letters left are not the 30 seeded jobs, each once:\n%q\n%q", got, all)
			}
			if out := mustExe(t, rawURL, exitOK, "", "dead", "redrive", "--queue", queue, "--all"); out != fmt.Sprintf("redrove %d dead letters to queue %q\n", 30-n, queue) {
				t.Fatalf("the second run: %s", out)
			}
		})
	}
}
