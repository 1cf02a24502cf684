package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

func workflowShowCmd() *command {
	return &command{
		name:    "workflow show",
		args:    "ID",
		summary: "show a workflow (or a batch with a callback): each step's state, dependencies and job",
		help: `
Prints the workflow's name, when it was created, whether it was cancelled,
and a table of its steps: state (waiting, enqueued, succeeded, failed,
skipped, cancelled), the dead-letter reason of a failed step, the attempt
(how many times a redrive enqueued it again), its dependencies, the size of
its result and its job's ID (for "asyncctl job show" on a queue that
tracks status). The backend must have a store. --json prints every step's
result too (base64), and the page's Total, Offset and Next. Exit code 3
when there is no such workflow.

A step's record holds its job and its result (up to 64 KiB), so the steps
are read a page at a time: at most --limit steps (at most 100) from
--offset, fewer when their records reach 4 MiB. When the page does not
hold every step, the workflow's own state is not shown (it would read
every record) and the last line gives the next page's --offset.

Examples:

	asyncctl workflow show 5df6bd4d9dfe4982193141792389d5e0
	asyncctl workflow show 5df6bd4d9dfe4982193141792389d5e0 --offset 100
	asyncctl workflow show 5df6bd4d9dfe4982193141792389d5e0 --json | jq -r '.Steps[] | select(.State == "failed") | .Name'
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			var offset, limit int
			fs.IntVar(&offset, "offset", 0, "start at the step numbered `N` (from 0), printed by the previous page")
			fs.IntVar(&limit, "limit", ap.MaxWorkflowPageSteps, "show at most `N` steps (at most 100)")
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) != 1 || args[0] == "" {
					return usageErrorf("give one workflow ID")
				}
				if offset < 0 || offset > ap.MaxWorkflowSteps {
					return usageErrorf("--offset %d: give 0 to %d", offset, ap.MaxWorkflowSteps)
				}
				if limit < 1 || limit > ap.MaxWorkflowPageSteps {
					return usageErrorf("--limit %d: give 1 to %d", limit, ap.MaxWorkflowPageSteps)
				}
				return c.workflowShow(ctx, args[0], offset, limit)
			}
		},
	}
}

func workflowCancelCmd() *command {
	return &command{
		name:    "workflow cancel",
		args:    "ID",
		summary: "cancel a workflow: its steps not yet running never run, its running steps' contexts end",
		help: `
Steps not yet running never run (they are recorded cancelled); the handlers
of running steps have their context cancelled within about a second, and a
step whose handler then returns an error is dead-lettered as cancelled,
never retried. Cancelling twice is not an error. Exit code 3 when there is
no such workflow.

Examples:

	asyncctl workflow cancel 5df6bd4d9dfe4982193141792389d5e0
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) != 1 || args[0] == "" {
					return usageErrorf("give one workflow ID")
				}
				return c.workflowCancel(ctx, args[0])
			}
		},
	}
}

// workflowNotFound is the error of a workflow with no record.
func workflowNotFound(id string) error {
	return notFoundf("no workflow %q (unknown, or past its retention)", field(id))
}

func (c *cli) workflowShow(ctx context.Context, id string, offset, limit int) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	st, err := p.WorkflowStatusPage(ctx, id, offset, limit)
	if errors.Is(err, ap.ErrWorkflowNotFound) {
		return workflowNotFound(id)
	}
	if err != nil {
		return err
	}
	if offset > 0 && offset >= st.Total {
		return usageErrorf("--offset %d: workflow %s has %s, numbered from 0", offset, field(id), plural(st.Total, "step"))
	}
	if c.json {
		return writeJSON(c.stdout, st)
	}
	return printWorkflow(c.stdout, time.Now(), st)
}

func (c *cli) workflowCancel(ctx context.Context, id string) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	// CancelWorkflow marks any valid ID: look the workflow up first, so
	// that a mistyped ID is reported, not marked.
	if _, err := p.WorkflowStatusPage(ctx, id, 0, 1); errors.Is(err, ap.ErrWorkflowNotFound) {
		return workflowNotFound(id)
	} else if err != nil {
		return err
	}
	if err := p.CancelWorkflow(ctx, id); err != nil {
		return err
	}
	st, err := p.WorkflowStatusPage(ctx, id, 0, 0)
	if err != nil {
		return err
	}
	if c.json {
		return json1(c.stdout, st)
	}
	fmt.Fprintf(c.stdout, "cancel requested for workflow %s: steps not yet running will not run; running steps' handlers see their context end within about a second\n", field(id))
	return nil
}

// printWorkflow prints a page of a workflow's status, for people: every
// field read from the store is escaped.
func printWorkflow(w io.Writer, now time.Time, st ap.WorkflowPage) error {
	fmt.Fprintf(w, "ID:        %s\n", field(st.ID))
	if st.Name != "" {
		fmt.Fprintf(w, "Name:      %s\n", field(st.Name))
	}
	if !st.Created.IsZero() {
		fmt.Fprintf(w, "Created:   %s (%s ago)\n", st.Created.UTC().Format(time.RFC3339), age(now, st.Created))
	}
	whole := ap.WorkflowStatus{Steps: st.Steps}
	state := "running"
	switch {
	case !st.Whole():
		state = "see the steps (a page does not read them all)"
	case whole.Succeeded():
		state = "succeeded"
	case whole.Done():
		state = "ended, not every step succeeded"
	}
	if st.Cancelled {
		state += ", cancelled"
	}
	fmt.Fprintf(w, "State:     %s\n", state)
	counts := map[string]int{}
	for _, s := range st.Steps {
		counts[s.State]++
	}
	var parts []string
	for _, k := range []string{"waiting", "enqueued", "succeeded", "failed", "skipped", "cancelled"} {
		if counts[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[k], k))
		}
	}
	if st.Whole() {
		fmt.Fprintf(w, "Steps:     %s (%s)\n\n", plural(st.Total, "step"), strings.Join(parts, ", "))
	} else {
		fmt.Fprintf(w, "Steps:     %s; %d to %d shown (%s)\n\n", plural(st.Total, "step"), st.Offset+1, st.Offset+len(st.Steps), strings.Join(parts, ", "))
	}
	rows := make([][]string, len(st.Steps))
	for i, s := range st.Steps {
		state := field(s.State)
		if s.Reason != "" {
			state += " (" + field(string(s.Reason)) + ")"
		}
		deps := strings.Join(fields(s.DependsOn), ",")
		if deps == "" {
			deps = "-"
		}
		result := "-"
		if len(s.Result) > 0 {
			result = plural(len(s.Result), "byte")
		}
		rows[i] = []string{field(s.Name), state, strconv.Itoa(s.Attempt), shorten(deps, 60), result, field(s.JobID)}
	}
	if err := table(w, []string{"STEP", "STATE", "ATTEMPT", "DEPENDS ON", "RESULT", "JOB"}, rows); err != nil {
		return err
	}
	if st.Next != 0 {
		_, err := fmt.Fprintf(w, "\nmore steps: asyncctl workflow show %s --offset %d\n", field(st.ID), st.Next)
		return err
	}
	return nil
}
