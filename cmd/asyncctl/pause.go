package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	ap "github.com/asyncplatform/asyncplatform"
)

func pauseCmd() *command  { return pauseOrResume("pause") }
func resumeCmd() *command { return pauseOrResume("resume") }

func pauseOrResume(name string) *command {
	c := &command{
		name: name,
		args: "QUEUE...",
		help: `
A paused queue keeps its jobs and takes new ones, but no worker process
claims any: within about half a second every worker stops claiming, hands
back uncounted the jobs it had claimed ahead, and lets its running
handlers finish. The pause is kept in the backend's store, so it outlives
the workers and asyncctl; "asyncctl resume" ends it. A backend without a
store (RabbitMQ without a companion store) cannot pause. "asyncctl queues"
shows which queues are paused.

Examples:

	asyncctl pause emails
	asyncctl resume emails billing
`,
	}
	if name == "pause" {
		c.summary = "pause queues for every worker until they are resumed"
	} else {
		c.summary = "resume paused queues"
	}
	c.setup = func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		return func(ctx context.Context, cl *cli, args []string) error {
			if len(args) == 0 {
				return usageErrorf("name at least one queue")
			}
			for _, q := range args {
				if err := checkQueue("", q); err != nil {
					return err
				}
			}
			return cl.pause(ctx, name == "pause", args)
		}
	}
	return c
}

// pauseJSON is what --json prints for each queue paused or resumed.
type pauseJSON struct {
	Queue  string `json:"queue"`
	Paused bool   `json:"paused"`
}

func (c *cli) pause(ctx context.Context, pause bool, queues []string) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	out := make([]pauseJSON, 0, len(queues))
	for _, q := range queues {
		if pause {
			err = p.Pause(ctx, q)
		} else {
			err = p.Resume(ctx, q)
		}
		if errors.Is(err, ap.ErrNoStore) {
			return fmt.Errorf("%w (pausing needs the backend's store)", err)
		}
		if err != nil {
			return err
		}
		out = append(out, pauseJSON{Queue: q, Paused: pause})
	}
	if c.json {
		return writeJSON(c.stdout, out)
	}
	for _, o := range out {
		state := "resumed"
		if o.Paused {
			state = "paused"
		}
		fmt.Fprintf(c.stdout, "%s: %s\n", field(o.Queue), state)
	}
	return nil
}
