package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

func jobShowCmd() *command {
	return &command{
		name:    "job show",
		args:    "ID",
		summary: "show a tracked job's status: state, tries, last error, result, worker, history",
		help: `
The job's queue must track status (Config.TrackStatus or
QueueConfig.TrackStatus on the platforms that enqueue and work it), and the
backend must have a store (RabbitMQ: its companion store). A result that is
not text is shown as a hex dump, cut at 4 KiB; --json prints it all
(base64). Exit code 3 when the job has no status: unknown, untracked, or
past its retention. The history lists the job's state changes, oldest
first, with their time, try and reason (the dead-letter reason, a retry's
error, what scheduled the job again): the latest 20.

Examples:

	asyncctl job show 0193a3b2-7c1e-7d40-9a55-2f0c4e8b1a77
	asyncctl job show 0193a3b2-7c1e-7d40-9a55-2f0c4e8b1a77 --json | jq -r .state
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) != 1 || args[0] == "" {
					return usageErrorf("give one job ID")
				}
				return c.jobShow(ctx, args[0])
			}
		},
	}
}

func jobCancelCmd() *command {
	return &command{
		name:    "job cancel",
		args:    "ID",
		summary: "cancel a tracked job: it never runs, or its running handler's context ends",
		help: `
A job not yet running never runs: the worker that takes it dead-letters it
with reason cancelled. A running job's handler context is cancelled within
about a second; when the handler then returns an error the job is
dead-lettered as cancelled, never retried. Cancelling twice is not an
error. Exit code 3 when the job has no status; 1 when it has finished
already.

Examples:

	asyncctl job cancel 0193a3b2-7c1e-7d40-9a55-2f0c4e8b1a77
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) != 1 || args[0] == "" {
					return usageErrorf("give one job ID")
				}
				return c.jobCancel(ctx, args[0])
			}
		},
	}
}

func (c *cli) jobShow(ctx context.Context, id string) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	st, err := p.Status(ctx, id)
	if errors.Is(err, ap.ErrJobNotFound) {
		return notFoundf("no status for job %q (unknown, on a queue that does not track status, or past its retention)", field(id))
	}
	if err != nil {
		return err
	}
	if c.json {
		return writeJSON(c.stdout, st)
	}
	printStatus(c.stdout, time.Now(), st)
	return nil
}

func (c *cli) jobCancel(ctx context.Context, id string) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	err = p.Cancel(ctx, id)
	switch {
	case errors.Is(err, ap.ErrJobNotFound):
		return notFoundf("no status for job %q (unknown, on a queue that does not track status, or past its retention)", field(id))
	case errors.Is(err, ap.ErrJobFinished):
		st, _ := p.Status(ctx, id)
		return fmt.Errorf("job %q has finished already (%s): nothing to cancel", field(id), field(string(st.State)))
	case err != nil:
		return err
	}
	st, err := p.Status(ctx, id)
	if err != nil {
		return err
	}
	if c.json {
		return json1(c.stdout, st)
	}
	what := "it will not run (or, taken by a worker since its status was written, its handler's context ends within about a second)"
	if st.State == ap.StateRunning {
		what = "its handler's context ends within about a second"
	}
	fmt.Fprintf(c.stdout, "cancel requested for job %s (%s): %s\n", field(id), field(string(st.State)), what)
	return nil
}

// printStatus prints a job's status, for people.
func printStatus(w io.Writer, now time.Time, st ap.JobStatus) {
	fmt.Fprintf(w, "ID:        %s\n", field(st.ID))
	fmt.Fprintf(w, "Type:      %s\n", field(st.Type))
	fmt.Fprintf(w, "Queue:     %s\n", field(st.Queue))
	state := field(string(st.State))
	if st.Reason != "" {
		state += " (" + field(string(st.Reason)) + ")"
	}
	if st.CancelRequested && !st.State.Terminal() {
		state += ", cancel requested"
	}
	fmt.Fprintf(w, "State:     %s\n", state)
	if !st.RetryAt.IsZero() {
		fmt.Fprintf(w, "Due:       %s (%s)\n", st.RetryAt.UTC().Format(time.RFC3339), until(now, st.RetryAt))
	}
	fmt.Fprintf(w, "Tries:     %d (failures %d, crashes %d)\n", st.Tries, st.Failures, st.Crashes)
	stamp := func(label string, t time.Time) {
		if !t.IsZero() {
			fmt.Fprintf(w, "%-10s %s (%s ago)\n", label+":", t.UTC().Format(time.RFC3339), age(now, t))
		}
	}
	stamp("Enqueued", st.EnqueuedAt)
	stamp("Started", st.StartedAt)
	stamp("Updated", st.UpdatedAt)
	if st.Worker != "" {
		fmt.Fprintf(w, "Worker:    %s\n", field(st.Worker))
	}
	if st.Error != "" {
		fmt.Fprintf(w, "Error:     %s\n", field(st.Error))
	}
	if st.ResultSize > 0 {
		fmt.Fprintf(w, "Result:    %d bytes\n", st.ResultSize)
		if len(st.Result) < st.ResultSize {
			fmt.Fprintf(w, "  (too large to keep in the status: over %d bytes)\n", ap.MaxStatusResult)
		}
		printBytes(w, st.Result)
	}
	printHistory(w, st)
}

// printHistory prints a job's state changes, oldest first, one a line.
func printHistory(w io.Writer, st ap.JobStatus) {
	if len(st.History) == 0 && st.HistoryDropped == 0 {
		return
	}
	fmt.Fprintf(w, "History:\n")
	if st.HistoryDropped > 0 {
		fmt.Fprintf(w, "  (%d earlier changes not kept: a status keeps the latest %d)\n", st.HistoryDropped, ap.MaxStatusHistory)
	}
	for _, c := range st.History {
		line := fmt.Sprintf("  %s  %-13s  try %d", c.At.UTC().Format("2006-01-02T15:04:05.000Z"), field(string(c.State)), c.Try)
		if c.Reason != "" {
			line += "  " + field(c.Reason)
		}
		fmt.Fprintln(w, line)
	}
}

// until says how far t is from now: "in 3s", or "due" when it has passed.
func until(now, t time.Time) string {
	if !t.After(now) {
		return "due"
	}
	return "in " + age(t, now)
}
