package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	ap "github.com/asyncplatform/asyncplatform"
)

func pauseCmd() *command  { return pauseOrResume("pause") }
func resumeCmd() *command { return pauseOrResume("resume") }

const (
	pauseHelp = `
A paused queue keeps its jobs and takes new ones, but no worker process
claims any: within about half a second every worker stops claiming, hands
back uncounted the jobs it had claimed ahead, and lets its running
handlers finish. The pause is kept in the backend's store, so it outlives
the workers and asyncctl; "asyncctl resume" ends it. A backend without a
store (RabbitMQ without a companion store) cannot pause. "asyncctl queues"
shows which queues are paused.

With --group, only the jobs of that group (Job.Group: a tenant, a
customer, a batch) are paused, on each queue named: workers set them aside
on the queue's held queue (QUEUE.held.GROUP) as they come, and the other
jobs keep flowing (a queue's priority levels too: QUEUE.prioN.held.GROUP).
"resume --group" moves every held job back, in order, byte for byte (a
signed job stays signed: no key is needed), and says how many; it waits
about a second and a half for the workers to notice first.

A queue the backend does not hold (no job, no dead letter, no
declaration, not paused) is refused as unknown, exit code 3, and nothing is
paused: a typo would otherwise pause nothing anyone uses. --force pauses a
queue before anything has declared it.

Examples:

	asyncctl pause emails
	asyncctl pause --group acme emails
	asyncctl pause --force reports    # no worker has declared it yet
`
	resumeHelp = `
"asyncctl pause" pauses queues, or the jobs of one group of a queue
(--group); resume ends it. Within about half a second every worker takes
the queue's jobs again. Resuming a queue that is not paused changes
nothing.

With --group, it moves every job held for the group (on the queue's held
queue, QUEUE.held.GROUP, and its priority levels' QUEUE.prioN.held.GROUP)
back to the queue, in order, byte for byte (a signed job stays signed: no
key is needed), and says how many; it waits about a second and a half for
the workers to notice first.

A queue the backend does not hold is refused as unknown, exit code 3.

Examples:

	asyncctl resume emails
	asyncctl resume emails billing
	asyncctl resume --group acme emails
`
)

func pauseOrResume(name string) *command {
	c := &command{name: name, args: "[--group GROUP] QUEUE...", help: pauseHelp}
	if name == "pause" {
		c.summary = "pause queues for every worker until they are resumed"
	} else {
		c.summary = "resume paused queues, or a paused group's jobs"
		c.help = resumeHelp
	}
	c.setup = func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		group := fs.String("group", "", "pause or resume only the jobs of this `GROUP`")
		force := new(bool)
		if name == "pause" {
			fs.BoolVar(force, "force", false, "pause a queue the backend does not hold yet")
		}
		return func(ctx context.Context, cl *cli, args []string) error {
			if len(args) == 0 {
				return usageErrorf("name at least one queue")
			}
			for _, q := range args {
				if err := checkQueue("", q); err != nil {
					return err
				}
			}
			return cl.pause(ctx, name == "pause", *group, *force, args)
		}
	}
	return c
}

// checkKnown refuses, with exit code 3, the queues named that the backend
// does not hold (ap.UnknownQueueError). A backend that cannot list its
// queues cannot tell: every name is taken.
func checkKnown(ctx context.Context, p *ap.Platform, queues []string, hint string) error {
	var unknown []string
	for _, q := range queues {
		err := p.CheckKnownQueue(ctx, q)
		var ue *ap.UnknownQueueError
		switch {
		case errors.As(err, &ue):
			unknown = append(unknown, q)
		case errors.Is(err, errors.ErrUnsupported):
			return nil
		case err != nil:
			return err
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	return notFoundf("unknown %s %s: the backend holds no such queue (asyncctl queues lists them)%s", pluralWord(len(unknown), "queue"), strings.Join(fields(unknown), ", "), hint)
}

// pauseJSON is what --json prints for each queue paused or resumed.
type pauseJSON struct {
	Queue  string `json:"queue"`
	Group  string `json:"group,omitempty"`
	Paused bool   `json:"paused"`
	Moved  *int   `json:"moved,omitempty"` // resume --group: held jobs moved back
}

func (c *cli) pause(ctx context.Context, pause bool, group string, force bool, queues []string) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	if !force {
		hint := ""
		if pause {
			hint = "; nothing was paused (--force pauses a queue before anything declares it)"
		}
		if err := checkKnown(ctx, p, queues, hint); err != nil {
			return err
		}
	}
	out := make([]pauseJSON, 0, len(queues))
	for _, q := range queues {
		var moved *int
		switch {
		case group != "" && pause:
			err = p.PauseGroup(ctx, q, group)
		case group != "":
			var n int
			n, err = p.ResumeGroup(ctx, q, group)
			moved = &n
		case pause:
			err = p.Pause(ctx, q)
		default:
			err = p.Resume(ctx, q)
		}
		if errors.Is(err, ap.ErrInvalidJob) {
			return &exitErr{exitUsage, err}
		}
		if errors.Is(err, ap.ErrNoStore) {
			return fmt.Errorf("%w (pausing needs the backend's store)", err)
		}
		if err != nil {
			return err
		}
		out = append(out, pauseJSON{Queue: q, Group: group, Paused: pause, Moved: moved})
	}
	if c.json {
		return writeJSON(c.stdout, out)
	}
	for _, o := range out {
		state := "resumed"
		if o.Paused {
			state = "paused"
		}
		switch {
		case o.Moved != nil:
			fmt.Fprintf(c.stdout, "%s group %s: %s, %d held jobs moved back\n", field(o.Queue), field(o.Group), state, *o.Moved)
		case o.Group != "":
			fmt.Fprintf(c.stdout, "%s group %s: %s\n", field(o.Queue), field(o.Group), state)
		default:
			fmt.Fprintf(c.stdout, "%s: %s\n", field(o.Queue), state)
		}
	}
	return nil
}
