package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

func schedulesListCmd() *command {
	return &command{
		name:    "schedules list",
		args:    "[NAME...]",
		summary: "list periodic jobs with their last and next ticks",
		help: `
It lists the schedules (periodic jobs) that worker processes have run on
this backend, as the process that last started each one published it: the
cron expression or interval, the job's type and queue, how many missed
ticks it catches up, the last tick fired and the next one due (UTC), and
the worker that last started it, and when. A schedule taken out of the
code stays listed with its old STARTED. Name schedules to show only those.
Exit code 3 when there is none.

Examples:

	asyncctl schedules list
	asyncctl schedules list reports/daily --json
	asyncctl schedules list --json | jq -r '.[] | select(.last == null) | .name'
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			return func(ctx context.Context, c *cli, args []string) error {
				for _, n := range args {
					if err := checkScheduleName(n); err != nil {
						return err
					}
				}
				return c.schedulesList(ctx, args)
			}
		},
	}
}

func schedulesTriggerCmd() *command {
	return &command{
		name:    "schedules trigger",
		args:    "NAME",
		summary: "enqueue a periodic job's job now, outside its ticks",
		help: `
It enqueues the job of the schedule NAME now, as the process that last
started the schedule defined it, and prints the job's ID. The job carries
the asyncplatform-schedule-trigger header (the time it was triggered)
instead of a tick; the schedule's ticks go on as before. A schedule whose
job is over the store's value limit (64 KiB) cannot be triggered from
here. Exit code 3 when no process has run the schedule on this backend.

Examples:

	asyncctl schedules trigger reports/daily
	asyncctl schedules trigger cleanup --json
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) != 1 {
					return usageErrorf("give one schedule NAME")
				}
				if err := checkScheduleName(args[0]); err != nil {
					return err
				}
				return c.schedulesTrigger(ctx, args[0])
			}
		},
	}
}

// checkScheduleName refuses a name no schedule can have, before the
// backend is opened.
func checkScheduleName(name string) error {
	if err := driver.CheckKey(name); err != nil {
		return usageErrorf("schedule name %s: %v", strconv.Quote(name), err)
	}
	return nil
}

// scheduleJSON is one schedule as --json prints it.
type scheduleJSON struct {
	Name        string    `json:"name"`
	Cron        string    `json:"cron,omitempty"`
	Every       string    `json:"every,omitempty"`
	CatchUp     int       `json:"catch_up"`
	Type        string    `json:"type,omitempty"`
	Queue       string    `json:"queue,omitempty"`
	Last        time.Time `json:"last,omitzero"`
	Next        time.Time `json:"next,omitzero"`
	Worker      string    `json:"worker,omitempty"`
	Started     time.Time `json:"started,omitzero"`
	Triggerable bool      `json:"triggerable"`
}

func (c *cli) schedulesList(ctx context.Context, names []string) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	list, err := p.Schedules(ctx, names...)
	if err != nil {
		return err
	}
	out := make([]scheduleJSON, len(list))
	for i, s := range list {
		out[i] = scheduleJSON{Name: s.Name, Cron: s.Cron, CatchUp: s.CatchUp, Type: s.Type, Queue: s.Queue,
			Last: s.Last.UTC(), Next: s.Next.UTC(), Worker: s.Worker, Started: s.Started.UTC(), Triggerable: s.Triggerable}
		if s.Every != 0 {
			out[i].Every = s.Every.String()
		}
		if s.Last.IsZero() {
			out[i].Last = time.Time{}
		}
		if s.Next.IsZero() {
			out[i].Next = time.Time{}
		}
		if s.Started.IsZero() {
			out[i].Started = time.Time{}
		}
	}
	if c.json {
		if err := writeJSON(c.stdout, out); err != nil {
			return err
		}
	} else if len(out) > 0 {
		rows := make([][]string, len(out))
		for i, s := range out {
			spec := s.Cron
			if s.Every != "" {
				spec = "every " + s.Every
			}
			if spec == "" {
				spec = "?" // a tick record without a definition (an older version's)
			}
			rows[i] = []string{field(s.Name), field(spec), field(s.Type), field(s.Queue), strconv.Itoa(s.CatchUp),
				stamp(s.Last), stamp(s.Next), field(s.Worker), stamp(s.Started)}
		}
		if err := table(c.stdout, []string{"NAME", "SCHEDULE", "TYPE", "QUEUE", "CATCH UP", "LAST", "NEXT", "STARTED BY", "STARTED"}, rows); err != nil {
			return err
		}
	}
	if len(out) == 0 {
		if len(names) > 0 {
			return notFoundf("no process has run these schedules on this backend")
		}
		return notFoundf("no process has run a schedule on this backend")
	}
	return nil
}

// stamp prints a time in UTC to the second, "-" for none.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func (c *cli) schedulesTrigger(ctx context.Context, name string) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	j, err := p.TriggerSchedule(ctx, name)
	if errors.Is(err, ap.ErrNoSchedule) {
		return &exitErr{exitNotFound, err}
	}
	if err != nil {
		return err
	}
	if c.json {
		return writeJSON(c.stdout, struct {
			ID       string `json:"id"`
			Schedule string `json:"schedule"`
			Type     string `json:"type"`
			Queue    string `json:"queue"`
		}{j.ID, name, j.Type, j.Queue})
	}
	fmt.Fprintln(c.stdout, field(j.ID))
	return nil
}
