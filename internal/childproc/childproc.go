// Package childproc runs the test binary again as a child process that
// re-runs one test, told what to do by a value in its environment, and
// talks to it by lines: the parent reads what the child writes on stdout
// and writes lines to its stdin. Every suite that runs workers in other
// processes (conformance, its store suite, its fault scenarios) starts them
// here, so there is one protocol: one environment variable per suite, read
// by the suite's Run, and a closed stdin to tell a child to finish.
package childproc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Config says what child to start.
type Config struct {
	// Test is the full name of the test the child runs (t.Name()); the
	// child's -test.run matches it exactly.
	Test string
	// Env and Value: the child finds Value in its environment variable Env.
	Env, Value string
	// Timeout is the child's -test.timeout: a child that hangs panics
	// with its goroutines' stacks and exits, and never outlives its
	// parent's run for long. Defaults to DefaultTimeout.
	Timeout time.Duration
	// Output, when set, takes the child's stdout and stderr (a log file):
	// Expect then has no lines to read. When nil, stdout is read as lines
	// and stderr is the parent's.
	Output io.Writer
	// DieWithParent has the kernel kill the child when the parent dies
	// (Linux only), for children that would otherwise outlive a parent
	// killed mid-test. The kernel sends it when the OS thread that started
	// the child exits, which the Go runtime does only for a goroutine that
	// ends locked to its thread.
	DieWithParent bool
}

// DefaultTimeout is Config.Timeout's default: go test's own default
// -timeout, which no child of a passing test comes near.
const DefaultTimeout = 10 * time.Minute

// Proc is a running child.
type Proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{} // closed when the child has exited
	err   error         // Wait's, once done is closed

	mu     sync.Mutex
	queue  []string      // lines read and not yet taken by Expect
	eof    bool          // its stdout is closed: no more lines
	rerr   error         // why reading its stdout stopped early (a line over 1 MiB)
	notify chan struct{} // a line or the end came (capacity 1)
	seen   []string      // the last lines it wrote, for failure messages
}

// maxSeen bounds the lines a Proc keeps for String.
const maxSeen = 400

// RunPattern is a -test.run pattern that matches the test named name and
// nothing else.
func RunPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// Start starts a child.
func Start(cfg Config) (*Proc, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	args := []string{"-test.run=" + RunPattern(cfg.Test), "-test.count=1", "-test.timeout=" + cfg.Timeout.String()}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), cfg.Env+"="+cfg.Value)
	if cfg.DieWithParent {
		DieWithParent(cmd)
	}
	p := &Proc{cmd: cmd, done: make(chan struct{}), notify: make(chan struct{}, 1)}
	// stdout is a pipe of our own, not cmd.StdoutPipe: Wait must not close
	// it under the reader, which reads it to its end.
	var pr, pw *os.File
	if cfg.Output != nil {
		cmd.Stdout, cmd.Stderr = cfg.Output, cfg.Output
		p.eof = true
	} else {
		var err error
		if pr, pw, err = os.Pipe(); err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = pw, os.Stderr
	}
	in, err := cmd.StdinPipe() // closed by the parent, or by its death: the child then finishes
	if err == nil {
		err = cmd.Start()
	}
	if pw != nil {
		pw.Close() // the child has its own copy
	}
	if err != nil {
		if pr != nil {
			pr.Close()
		}
		return nil, fmt.Errorf("starting a child process: %w", err)
	}
	p.stdin = in
	if pr != nil {
		go p.read(pr)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// read queues the child's stdout as lines until its end. It never blocks
// on the parent, whose Expect takes the lines at its own pace.
func (p *Proc) read(out *os.File) {
	defer out.Close()
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		l := sc.Text()
		p.mu.Lock()
		p.queue = append(p.queue, l)
		if len(p.seen) == maxSeen {
			p.seen = append(p.seen[:0], p.seen[maxSeen/2:]...)
		}
		p.seen = append(p.seen, l)
		p.mu.Unlock()
		p.wake()
	}
	err := sc.Err()
	if err != nil {
		_, _ = io.Copy(io.Discard, out) // keep the child from blocking on its stdout
	}
	p.mu.Lock()
	p.eof, p.rerr = true, err
	p.mu.Unlock()
	p.wake()
}

func (p *Proc) wake() {
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

// next takes the next line; ok is false when there is none yet, and end
// true when there will be none (rerr says why, when not the child's exit).
func (p *Proc) next() (line string, ok, end bool, rerr error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) > 0 {
		line, p.queue = p.queue[0], p.queue[1:]
		return line, true, false, nil
	}
	return "", false, p.eof, p.rerr
}

// ErrExited says the child's output ended before it wrote the line asked
// for.
var ErrExited = errors.New("the child process exited")

// ErrTimeout says the child did not write the line asked for in time.
var ErrTimeout = errors.New("the child process did not say it in time")

// exitGrace is how long Expect waits, once the child has exited, for the
// end of its output (a process it started may still hold its stdout).
const exitGrace = time.Second

// Expect returns the rest of the child's next line that starts with
// prefix, skipping its other lines, waiting at most d. One goroutine at a
// time may call it.
func (p *Proc) Expect(prefix string, d time.Duration) (string, error) {
	timeout := time.NewTimer(d)
	defer timeout.Stop()
	done := p.done
	var grace <-chan time.Time
	for {
		l, ok, end, rerr := p.next()
		switch {
		case ok:
			if rest, found := strings.CutPrefix(l, prefix); found {
				return rest, nil
			}
			continue
		case end && rerr != nil:
			return "", fmt.Errorf("%w before saying %q: reading its output: %w", ErrExited, prefix, rerr)
		case end:
			return "", fmt.Errorf("%w before saying %q", ErrExited, prefix)
		}
		select {
		case <-p.notify:
		case <-done: // its output may still be on its way
			done, grace = nil, time.After(exitGrace)
		case <-grace:
			return "", fmt.Errorf("%w before saying %q (its output was still open %v after)", ErrExited, prefix, exitGrace)
		case <-timeout.C:
			return "", fmt.Errorf("%w: %q within %v", ErrTimeout, prefix, d)
		}
	}
}

// Send writes a line to the child's stdin.
func (p *Proc) Send(line string) error {
	_, err := io.WriteString(p.stdin, line+"\n")
	return err
}

// CloseStdin closes the child's stdin, which tells it to finish, and
// does not wait.
func (p *Proc) CloseStdin() { _ = p.stdin.Close() }

// Done is closed when the child has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the child's exit error, once Done is closed.
func (p *Proc) Err() error { return p.err }

// Kill kills the child with SIGKILL and waits for it to exit.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	_ = p.stdin.Close()
}

// Term sends the child SIGTERM and waits for it to exit; after grace it is
// killed.
func (p *Proc) Term(grace time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	p.wait(grace)
}

// Stop closes the child's stdin, which tells it to finish, and waits for it
// to exit; after grace it is killed. It reports whether it had to kill.
func (p *Proc) Stop(grace time.Duration) (killed bool) {
	_ = p.stdin.Close()
	return p.wait(grace)
}

func (p *Proc) wait(grace time.Duration) (killed bool) {
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		killed = true
		p.Kill()
	}
	_ = p.stdin.Close()
	return killed
}

// String is the lines the child wrote (the last 40), for failure messages.
func (p *Proc) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := p.seen
	if len(seen) > 40 {
		return "  ...\n  " + strings.Join(seen[len(seen)-40:], "\n  ")
	}
	return "  " + strings.Join(seen, "\n  ")
}
