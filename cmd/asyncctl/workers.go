package main

import (
	"context"
	"flag"
	"strconv"
	"strings"
	"time"
)

func workersCmd() *command {
	return &command{
		name:    "workers",
		summary: "list the running worker processes",
		help: `
It lists the platforms running on this backend (between Start and Stop),
from the record each one writes to the store at every heartbeat
(Config.WorkerHeartbeat, 10s by default) and removes at Stop: its name,
host and pid, the queues it works, its concurrency, the jobs it held at
its last heartbeat (running, or claimed ahead), when it started, its last
heartbeat and the asyncplatform version it runs. A process that died
without Stop stays listed for three heartbeats. Exit code 3 when none runs.

Examples:

	asyncctl workers
	asyncctl workers --json | jq -r '.[] | .host + " " + (.held|tostring)'
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) > 0 {
					return usageErrorf("workers takes no arguments")
				}
				return c.workers(ctx)
			}
		},
	}
}

// workerJSON is one worker as --json prints it.
type workerJSON struct {
	ID          string    `json:"id"`
	Name        string    `json:"name"`
	Host        string    `json:"host"`
	PID         int       `json:"pid"`
	Queues      []string  `json:"queues"`
	Concurrency int       `json:"concurrency"`
	Held        int       `json:"held"`
	StartedAt   time.Time `json:"started_at,omitzero"`
	BeatAt      time.Time `json:"beat_at,omitzero"`
	Version     string    `json:"version"`
	Heartbeat   string    `json:"heartbeat"`
}

func (c *cli) workers(ctx context.Context) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	list, err := p.Workers(ctx)
	if err != nil {
		return err
	}
	out := make([]workerJSON, len(list))
	for i, w := range list {
		out[i] = workerJSON{ID: w.ID, Name: w.Name, Host: w.Host, PID: w.PID, Queues: w.Queues, Concurrency: w.Concurrency,
			Held: w.Held, StartedAt: w.StartedAt.UTC(), BeatAt: w.BeatAt.UTC(), Version: w.Version, Heartbeat: w.Heartbeat.String()}
		if out[i].Queues == nil {
			out[i].Queues = []string{}
		}
	}
	if c.json {
		if err := writeJSON(c.stdout, out); err != nil {
			return err
		}
	} else if len(out) > 0 {
		now := time.Now()
		rows := make([][]string, len(out))
		for i, w := range out {
			rows[i] = []string{field(w.Name), field(w.Host), strconv.Itoa(w.PID), field(strings.Join(w.Queues, ",")),
				strconv.Itoa(w.Concurrency), strconv.Itoa(w.Held), stamp(w.StartedAt), age(now, w.BeatAt), field(w.Version)}
		}
		if err := table(c.stdout, []string{"NAME", "HOST", "PID", "QUEUES", "CONCURRENCY", "HELD", "STARTED", "HEARTBEAT", "VERSION"}, rows); err != nil {
			return err
		}
	}
	if len(out) == 0 {
		return notFoundf("no worker is running on this backend")
	}
	return nil
}
