package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// exitInterrupted is the exit code of a long operation stopped by Ctrl-C
// (or SIGTERM) between two records: 128 + SIGINT, as shells report it.
const exitInterrupted = 130

// progress shows how far a long operation got: done/total, the rate and the
// time left, on stderr, only when stderr is a terminal and --json is off.
// Otherwise every method does nothing, so a script's output is unchanged.
type progress struct {
	bar *progressbar.ProgressBar // nil: off
}

// stderrIsTerminal reports whether stderr is a terminal: tests replace it.
var stderrIsTerminal = func(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progress starts a progress line for an operation on total records (-1:
// unknown, a spinner and a count), described by what ("redriving").
func (c *cli) progress(total int64, what string) *progress {
	if c.json || !stderrIsTerminal(c.stderr) {
		return &progress{}
	}
	bar := progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(c.stderr),
		progressbar.OptionSetDescription(what),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("records"),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetRenderBlankState(true),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSpinnerType(14),
	)
	return &progress{bar: bar}
}

// add counts n more records done.
func (p *progress) add(n int) {
	if p.bar != nil && n > 0 {
		_ = p.bar.Add(n)
	}
	if afterRecords != nil {
		afterRecords(n)
	}
}

// afterRecords, when set (by tests only), is called after each step of a
// long operation with the records it did.
var afterRecords func(n int)

// print runs fn, which prints lines of its own, with the progress line
// cleared first, so that the two do not run into each other on one
// terminal; the line comes back at the next add.
func (p *progress) print(fn func()) {
	if p.bar != nil {
		_ = p.bar.Clear()
	}
	fn()
}

// done removes the progress line; later calls do nothing.
func (p *progress) done() {
	if p.bar != nil {
		_ = p.bar.Clear()
		_ = p.bar.Exit()
		p.bar = nil
	}
}

// interruption is a long operation's way to stop between two records: the
// records themselves are written with a context that Ctrl-C does not
// cancel (so none is left half done), and stop says whether to go on.
type interruption struct {
	ctx  context.Context // cancelled by Ctrl-C
	work context.Context // for the records: not cancelled by Ctrl-C
	told bool
	c    *cli
}

func (c *cli) interruptible(ctx context.Context) *interruption {
	return &interruption{ctx: ctx, work: context.WithoutCancel(ctx), c: c}
}

// stop reports whether Ctrl-C was pressed; the first time, it says so.
func (in *interruption) stop() bool {
	if in.ctx.Err() == nil {
		return false
	}
	if !in.told {
		in.told = true
		fmt.Fprintln(in.c.stderr, "interrupted: stopping between two records (Ctrl-C again quits at once)")
	}
	return true
}

// wait sleeps for d, or until Ctrl-C; it reports whether to go on.
func (in *interruption) wait(d time.Duration) bool {
	if d <= 0 {
		return !in.stop()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-in.ctx.Done():
		return !in.stop()
	case <-t.C:
		return true
	}
}

// interrupted is the error of an operation stopped by Ctrl-C: msg says how
// far it got and what is left.
func interrupted(format string, args ...any) error {
	return &exitErr{exitInterrupted, fmt.Errorf("interrupted: "+format, args...)}
}
