package conformance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/childproc"
)

// procEnv carries a child process's part to it: the case's name, its
// queue and the child's argument, separated by procSep.
const procEnv = "ASYNCPLATFORM_CONFORMANCE_PROC"

const procSep = "\x1f"

// procPrefix starts every line a child writes for its parent.
const procPrefix = "CONFORMANCE "

// childMains are the child processes' parts, by case name: a case that
// runs processes registers what its children do here.
var childMains = map[string]func(t *testing.T, k *kid, arg string){
	"Unique/ConcurrentProcesses":   uniqueChild,
	"Schedule/OnePerTickProcesses": scheduleChild,
	"Schedule/RestartSkipsMissed":  scheduleChild,
	"Schedule/RestartCatchesUp":    scheduleChild,
	"Flow/ClusterConcurrency":      limitChild,
	"Flow/RateLimit":               limitChild,
	"Crash/ProcessKill":            processKillChild,
	"Outcomes/OutputSurvivesKill":  outputKillChild,
}

// RunsChild reports whether the case a test name ends in (t.Name() inside
// a HarnessMaker) runs workers in child processes, the test binary run
// again: the cases of childMains (Crash/ProcessKill,
// Outcomes/OutputSurvivesKill, Unique/ConcurrentProcesses, the Schedule
// process and restart cases, Flow/ClusterConcurrency, Flow/RateLimit). A
// harness whose server lives inside the test process shares that server
// with the child for these cases, through the environment (backend/redis
// does so for miniredis).
func RunsChild(testName string) bool {
	for c := range childMains {
		if strings.HasSuffix(testName, "/"+c) {
			return true
		}
	}
	return false
}

// child is a child process seen from the case that started it.
type child struct {
	n int
	p *childproc.Proc
}

// spawn runs the test binary again as a child process of the case t (which
// must be listed in childMains), running the case's child part with arg.
// The child is stopped at the end of the case: its stdin closed, then
// killed if it has not exited within 10 seconds.
func (e *env) spawn(t *testing.T, n int, arg string) *child {
	t.Helper()
	caseName := ""
	for c := range childMains {
		if strings.HasSuffix(t.Name(), "/"+c) {
			caseName = c
		}
	}
	if caseName == "" {
		t.Fatalf("spawn from %s, which has no child part", t.Name())
	}
	p, err := childproc.Start(childproc.Config{Test: t.Name(), Env: procEnv, Value: strings.Join([]string{caseName, e.queue, arg}, procSep)})
	if err != nil {
		t.Fatalf("child process %d: %v", n, err)
	}
	c := &child{n: n, p: p}
	t.Cleanup(func() { c.stop(t, 10*time.Second) })
	return c
}

// expect returns the rest of the child's next line that starts with
// procPrefix+word, skipping its other lines, or fails the case after d.
func (c *child) expect(t *testing.T, word string, d time.Duration) string {
	t.Helper()
	rest, err := c.p.Expect(procPrefix+word, d)
	if err != nil {
		t.Fatalf("child process %d: %v; it said:\n%s", c.n, err, c.p)
	}
	return strings.TrimSpace(rest)
}

// next returns the child's next line, waiting at most d; ok is false when
// none came in time, over when the child's output has ended.
func (c *child) next(d time.Duration) (line string, ok, over bool) {
	l, err := c.p.Expect("", d)
	return l, err == nil, errors.Is(err, childproc.ErrExited)
}

// send writes a line to the child's stdin.
func (c *child) send(t *testing.T, line string) {
	t.Helper()
	if err := c.p.Send(line); err != nil {
		t.Fatalf("writing to child process %d: %v", c.n, err)
	}
}

// finish closes the child's stdin, which tells it to finish; it does not
// wait.
func (c *child) finish() { c.p.CloseStdin() }

// kill kills the child with SIGKILL and waits for it.
func (c *child) kill(*testing.T) { c.p.Kill() }

// stop closes the child's stdin, which tells it to finish, and waits for
// it to exit; after grace it is killed.
func (c *child) stop(t *testing.T, grace time.Duration) {
	if c.p.Stop(grace) {
		t.Logf("child process %d had not exited %v after its stdin closed: killed", c.n, grace)
	}
}

func (c *child) String() string { return c.p.String() }

// kid is a child process's own side: the harness it opened and the
// parent's queue. Unlike a case's env, it never removes the queue: the
// parent owns it.
type kid struct {
	t     *testing.T
	h     Harness
	opts  Options
	queue string
	lease time.Duration
	stdin *bufio.Scanner

	mu       sync.Mutex
	backends []driver.Backend
}

// runProc is the child process's side of a case: Run calls it when
// procEnv is set, and it runs the case's child part.
func runProc(t *testing.T, makeHarness HarnessMaker, opts Options, v string) {
	parts := strings.SplitN(v, procSep, 3)
	if len(parts) != 3 || childMains[parts[0]] == nil {
		t.Fatalf("%s=%q: not a case's child process", procEnv, v)
	}
	name, queue, arg := parts[0], parts[1], parts[2]
	t.Run(name, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), opts.Wait)
		defer cancel()
		h, err := makeHarness(ctx, t)
		if err != nil {
			t.Fatalf("making the harness: %v", err)
		}
		k := &kid{t: t, h: h, opts: opts, queue: queue, stdin: bufio.NewScanner(os.Stdin)}
		defer k.close()
		k.lease = max(opts.Lease, k.backend().Capabilities().MinLease)
		childMains[name](t, k, arg)
	})
}

func (k *kid) backend() driver.Backend {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), k.opts.Wait)
	defer cancel()
	b, err := k.h.MakeBackend(ctx)
	if err != nil {
		k.t.Fatalf("making a backend: %v", err)
	}
	k.mu.Lock()
	k.backends = append(k.backends, b)
	k.mu.Unlock()
	return b
}

func (k *kid) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, b := range k.backends {
		_ = b.Close()
	}
	k.h.Close()
}

// platform makes a platform over a backend of its own; cfg.Lease is the
// suite's.
func (k *kid) platform(cfg ap.Config) *ap.Platform {
	k.t.Helper()
	cfg.Lease = k.lease
	p, err := ap.New(k.backend(), cfg)
	if err != nil {
		k.t.Fatalf("ap.New: %v", err)
	}
	return p
}

// waitStdin blocks until the parent closes the child's stdin.
func (k *kid) waitStdin() {
	for k.stdin.Scan() {
	}
}

var sayMu sync.Mutex

// say writes one line for the parent.
func say(format string, args ...any) {
	sayMu.Lock()
	defer sayMu.Unlock()
	fmt.Fprintf(os.Stdout, procPrefix+format+"\n", args...)
}

// logWriter writes a platform's log records (one JSON object a line) as
// "LOG" lines for the parent.
type logWriter struct{}

func (logWriter) Write(b []byte) (int, error) {
	say("LOG %s", strings.TrimSpace(string(b)))
	return len(b), nil
}
