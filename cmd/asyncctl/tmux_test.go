package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/testenv"
)

// tmux is a terminal of the test's own: a tmux server on a socket of its
// own, with one window running a command, read with capture-pane and typed
// into with send-keys.
type tmux struct {
	t      *testing.T
	bin    string
	socket string
}

// newTmux starts command (a shell command line) in a 120x24 terminal; the
// server is killed when the test ends. The pane stays after the command
// exits, so that its exit status can be read.
func newTmux(t *testing.T, command string) *tmux {
	t.Helper()
	x := &tmux{t: t, bin: testenv.Tool(t, "tmux")}
	b := make([]byte, 6)
	rand.Read(b)
	x.socket = "asyncctl-test-" + hex.EncodeToString(b)
	t.Cleanup(func() { _ = exec.Command(x.bin, "-L", x.socket, "kill-server").Run() })
	x.run("-f", "/dev/null", "start-server", ";", "set-option", "-g", "remain-on-exit", "on", ";",
		"new-session", "-d", "-s", "main", "-x", "120", "-y", "24", command)
	return x
}

func (x *tmux) run(args ...string) string {
	x.t.Helper()
	out, err := exec.Command(x.bin, append([]string{"-L", x.socket}, args...)...).CombinedOutput()
	if err != nil {
		x.t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// screen is what the terminal shows now, after the lines that scrolled
// off it (tmux's notice that the command ended scrolls the last ones).
func (x *tmux) screen() string { return x.run("capture-pane", "-p", "-S", "-", "-t", "main") }

// keys types keys (tmux key names: "q", "Enter", "C-c").
func (x *tmux) keys(keys ...string) { x.run(append([]string{"send-keys", "-t", "main"}, keys...)...) }

// waitFor waits until the screen matches every pattern, and returns it.
func (x *tmux) waitFor(what string, patterns ...string) string {
	x.t.Helper()
	res := make([]*regexp.Regexp, len(patterns))
	for i, p := range patterns {
		res[i] = regexp.MustCompile(p)
	}
	deadline := time.Now().Add(30 * time.Second) // a safety net, not an assertion on time
	for {
		s := x.screen()
		ok := true
		for _, re := range res {
			ok = ok && re.MatchString(s)
		}
		if ok {
			return s
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("the terminal never showed %s:\n%s", what, s)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// exited waits for the command to end and returns its exit status.
func (x *tmux) exited() int {
	x.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var dead, status int
		fmt.Sscan(x.run("display-message", "-p", "-t", "main", "#{pane_dead} #{pane_dead_status}"), &dead, &status)
		if dead == 1 {
			return status
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("the command did not end:\n%s", x.screen())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// prefixedRedis returns a URL of the machine's Redis under a key prefix of
// the test's own, so that "every queue" is this test's queues only.
func prefixedRedis(t *testing.T) string {
	t.Helper()
	s := servers[0]
	b := make([]byte, 4)
	rand.Read(b)
	rawURL := s.url(t) + "?prefix=asyncctl-tmux-" + hex.EncodeToString(b)
	reachable(t, s.name, rawURL)
	return rawURL
}

// shell quotes s for the shell tmux runs a command with.
func shell(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// asyncctl top in a real terminal: it lists every queue with its depths
// and the oldest dead letter's age, marks a paused queue, refreshes in place
// as jobs arrive (PENDING/s goes up) and as the queue is resumed, sorts on
// s, and quits on q with status 0.
func TestTopInTmux(t *testing.T) {
	t.Parallel()
	rawURL := prefixedRedis(t)
	bin := binary(t)
	emails, billing, reports := "emails", "billing", "reports.daily"
	for _, q := range []string{emails, billing, reports} {
		deleteAfter(t, rawURL, q)
	}
	seedDead(t, rawURL, emails, 3)
	enqueue := func(queue string, n int, delay time.Duration) {
		for range n {
			args := []string{"enqueue", "--queue", queue, "--type", "t", "--payload", "x"}
			if delay > 0 {
				args = append(args, "--delay", delay.String())
			}
			mustExe(t, rawURL, exitOK, "", args...)
		}
	}
	enqueue(billing, 5, 0)
	enqueue(reports, 1, time.Hour)
	mustExe(t, rawURL, exitOK, "", "pause", billing)
	t.Cleanup(func() { exe(t, rawURL, "", "resume", billing) })

	x := newTmux(t, fmt.Sprintf("ASYNCPLATFORM_URL=%s %s top --interval 200ms", shell(rawURL), shell(bin)))
	screen := x.waitFor("every queue",
		`asyncctl top · redis://127\.0\.0\.1:\d+/0\?prefix=asyncctl-tmux-\w+ · 3 queues · every 200ms · \d\d:\d\d:\d\d`,
		`(?m)^QUEUE\s+READY\s+OLDEST READY\s+SCHEDULED\s+IN FLIGHT\s+DEAD\s+PENDING/s\s+DEAD/s\s+OK/5m\s+FAILED/5m\s+OLDEST DEAD$`,
		`(?m)^billing \(paused\)\s+5\s+\d+s\s+0\s+0\s+0\s+[+-]\d+\.\d\s+[+-]\d+\.\d\s+\d+\s+\d+\s*$`,
		`(?m)^emails\s+0\s+0\s+0\s+3\s+[+-]\d+\.\d\s+[+-]\d+\.\d\s+\d+\s+\d+\s+\d+s$`,
		`(?m)^reports\.daily\s+0\s+1\s+0\s+0\s`,
		`(?m)^TOTAL\s+5\s+1\s+0\s+3$`,
		`q quit · s sort by dead letters`)
	t.Logf("top:\n%s", screen)
	if i, j := strings.Index(screen, "\nbilling"), strings.Index(screen, "\nemails"); i > j {
		t.Errorf("not sorted by name:\n%s", screen)
	}

	// Jobs arrive: the view refreshes in place.
	enqueue(billing, 7, 0)
	x.waitFor("the new jobs", `(?m)^billing \(paused\)\s+12\s+\d+s\s+0\s+0\s+0\s+\+[1-9]\d*\.\d\s`, `(?m)^TOTAL\s+12\s+1\s+0\s+3$`)

	// Resumed: the mark goes at the next refresh.
	mustExe(t, rawURL, exitOK, "", "resume", billing)
	x.waitFor("billing resumed", `(?m)^billing\s+12\s`)

	// s sorts by dead letters: emails first.
	x.keys("s")
	screen = x.waitFor("the rows sorted by dead letters", `q quit · s sort by ready jobs`)
	if i, j := strings.Index(screen, "\nemails"), strings.Index(screen, "\nbilling"); i < 0 || i > j {
		t.Errorf("not sorted by dead letters:\n%s", screen)
	}
	x.keys("q")
	if status := x.exited(); status != 0 {
		t.Fatalf("top exited %d:\n%s", status, x.screen())
	}
}

// deleteAfter deletes the queue when the test ends.
func deleteAfter(t *testing.T, rawURL, queue string) {
	t.Cleanup(func() {
		ctx := context.Background()
		b, err := ap.Open(ctx, rawURL)
		if err != nil {
			return
		}
		defer b.Close()
		_ = b.(driver.QueueDeleter).DeleteQueue(ctx, queue)
	})
}

// A long redrive in a real terminal shows its progress on stderr, done of
// total, the rate and the time left, then takes it away.
func TestProgressInTmux(t *testing.T) {
	t.Parallel()
	rawURL := prefixedRedis(t)
	bin := binary(t)
	deleteAfter(t, rawURL, "emails")
	seedDead(t, rawURL, "emails", 8)
	x := newTmux(t, fmt.Sprintf("ASYNCPLATFORM_URL=%s %s dead redrive --queue emails --all --rate 2", shell(rawURL), shell(bin)))
	screen := x.waitFor("the progress", `redriving\s+\d+% \|.*\| \([2-6]/8, \d+(\.\d+)? records/s\) \[\d+s:\d+s\]`)
	t.Logf("progress:\n%s", screen)
	if status := x.exited(); status != 0 {
		t.Fatalf("redrive exited %d:\n%s", status, x.screen())
	}
	screen = x.screen()
	if !strings.Contains(screen, `redrove 8 dead letters to queue "emails"`) || strings.Contains(screen, "redriving") {
		t.Fatalf("after the redrive:\n%s", screen)
	}
}

// top refuses to run without a terminal, and says what to use instead.
func TestTopNeedsTerminal(t *testing.T) {
	t.Parallel()
	code, _, errOut := ctl(t, "", "top", "--url", memURL(t))
	if code != exitUsage || !strings.Contains(errOut, "top needs a terminal; for scripts, use asyncctl queues (--json)") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}
