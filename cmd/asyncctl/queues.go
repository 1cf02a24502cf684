package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// listFlag is a flag that may be given several times.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func queuesCmd() *command {
	return &command{
		name:    "queues",
		args:    "[QUEUE...]",
		summary: "show the depths of queues: ready, scheduled, in flight, dead",
		help: `
Not every broker can list its queues, so name them: as arguments, with
--queue (repeatable), or both. With none, the queue is "default".
A depth the backend cannot tell is printed as "-" (-1 in JSON).

Examples:

	asyncctl queues emails billing
	asyncctl queues --queue emails --json
	asyncctl --url redis://127.0.0.1:6379/0 queues default
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			var queues listFlag
			fs.Var(&queues, "queue", "a `QUEUE` to show (repeatable)")
			return func(ctx context.Context, c *cli, args []string) error {
				names := append(args, queues...)
				if len(names) == 0 {
					names = []string{ap.DefaultQueue}
				}
				for _, q := range names {
					if err := checkQueue("", q); err != nil {
						return err
					}
				}
				return c.queues(ctx, names)
			}
		},
	}
}

// queueJSON is one queue's depths as --json prints them.
type queueJSON struct {
	Queue     string `json:"queue"`
	Ready     int64  `json:"ready"`
	Scheduled int64  `json:"scheduled"`
	InFlight  int64  `json:"in_flight"`
	Dead      int64  `json:"dead"`
}

func (c *cli) queues(ctx context.Context, names []string) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	out := make([]queueJSON, 0, len(names))
	for _, q := range names {
		s, err := p.Stats(ctx, q)
		if errors.Is(err, ap.ErrInvalidJob) {
			return &exitErr{exitUsage, err}
		}
		if err != nil {
			return err
		}
		out = append(out, queueJSON{Queue: q, Ready: s.Ready, Scheduled: s.Scheduled, InFlight: s.InFlight, Dead: s.Dead})
	}
	if c.json {
		return writeJSON(c.stdout, out)
	}
	rows := make([][]string, len(out))
	for i, s := range out {
		rows[i] = []string{field(s.Queue), count(s.Ready), count(s.Scheduled), count(s.InFlight), count(s.Dead)}
	}
	return table(c.stdout, []string{"QUEUE", "READY", "SCHEDULED", "IN FLIGHT", "DEAD"}, rows)
}

func enqueueCmd() *command {
	return &command{
		name:    "enqueue",
		args:    "--type TYPE [--payload TEXT | --file PATH | < PAYLOAD]",
		summary: "enqueue one job",
		help: `
The payload comes from --payload, from --file (- for stdin), or else from
stdin when it is not a terminal; give --payload '' for an empty one. It
prints the job's ID.

Examples:

	asyncctl enqueue --type email.send --queue emails --payload '{"to":"ann@example.com"}'
	asyncctl enqueue --type report.build --file report.json --delay 10m
	echo -n hello | asyncctl enqueue --type greet --retry-limit 0 --header tenant=acme
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			var e enqueueOpts
			var headers listFlag
			fs.StringVar(&e.typ, "type", "", "the job `TYPE` (required)")
			fs.StringVar(&e.queue, "queue", ap.DefaultQueue, "the `QUEUE`")
			fs.StringVar(&e.payload, "payload", "", "the payload `TEXT`")
			fs.StringVar(&e.file, "file", "", "read the payload from `PATH` (- for stdin)")
			fs.StringVar(&e.id, "id", "", "the job `ID`; generated when empty")
			fs.DurationVar(&e.delay, "delay", 0, "do not run the job before this `DURATION` has passed")
			fs.DurationVar(&e.deadline, "deadline", 0, "dead-letter the job as expired if it cannot start within this `DURATION` (counted after --delay)")
			fs.IntVar(&e.retryLimit, "retry-limit", -1, "failures allowed before the job is dead-lettered (`N`); -1: the worker's policy")
			fs.IntVar(&e.poisonLimit, "poison-limit", -1, "crashes allowed before the job is dead-lettered as poison (`N`); -1: the worker's policy")
			fs.Var(&headers, "header", "a `KEY=VALUE` header (repeatable)")
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) > 0 {
					return usageErrorf("unexpected arguments %q", args)
				}
				fs.Visit(func(f *flag.Flag) { e.payloadSet = e.payloadSet || f.Name == "payload" })
				e.headers = headers
				return c.enqueue(ctx, e)
			}
		},
	}
}

type enqueueOpts struct {
	typ, queue, payload, file, id string
	payloadSet                    bool
	delay, deadline               time.Duration
	retryLimit, poisonLimit       int
	headers                       []string
}

func (c *cli) enqueue(ctx context.Context, e enqueueOpts) error {
	if e.typ == "" {
		return usageErrorf("--type is required")
	}
	if err := checkQueue("--queue: ", e.queue); err != nil {
		return err
	}
	if e.payloadSet && e.file != "" {
		return usageErrorf("give --payload or --file, not both")
	}
	if e.delay < 0 || e.deadline < 0 || e.retryLimit < -1 || e.poisonLimit < -1 {
		return usageErrorf("--delay and --deadline must not be negative, --retry-limit and --poison-limit must be -1 or more")
	}
	job := &ap.Job{ID: e.id, Type: e.typ, Queue: e.queue}
	for _, h := range e.headers {
		k, v, ok := strings.Cut(h, "=")
		if !ok || k == "" {
			return usageErrorf("--header %q is not KEY=VALUE", h)
		}
		if job.Headers == nil {
			job.Headers = map[string]string{}
		}
		job.Headers[k] = v
	}
	var err error
	switch {
	case e.payloadSet:
		job.Payload = []byte(e.payload)
	case e.file == "-":
		job.Payload, err = io.ReadAll(c.stdin)
	case e.file != "":
		job.Payload, err = os.ReadFile(e.file)
	case isTerminal(c.stdin):
		return usageErrorf("no payload: give --payload or --file, or pipe it on stdin (--payload '' for an empty one)")
	default:
		job.Payload, err = io.ReadAll(c.stdin)
	}
	if err != nil {
		return fmt.Errorf("reading the payload: %w", err)
	}
	now := time.Now()
	if e.delay > 0 {
		job.NotBefore = now.Add(e.delay)
	}
	if e.deadline > 0 {
		job.Deadline = now.Add(e.delay + e.deadline)
	}
	if e.retryLimit >= 0 {
		job.Policy.RetryLimit = ap.Limit(e.retryLimit)
	}
	if e.poisonLimit >= 0 {
		job.Policy.PoisonLimit = ap.Limit(e.poisonLimit)
	}

	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	if err := p.Enqueue(ctx, job); err != nil {
		if errors.Is(err, ap.ErrInvalidJob) || errors.Is(err, ap.ErrPayloadTooLarge) {
			return &exitErr{exitUsage, err}
		}
		return err
	}
	if c.json {
		return writeJSON(c.stdout, struct {
			ID        string    `json:"id"`
			Type      string    `json:"type"`
			Queue     string    `json:"queue"`
			Bytes     int       `json:"bytes"`
			NotBefore time.Time `json:"not_before,omitzero"`
		}{job.ID, job.Type, job.Queue, len(job.Payload), job.NotBefore})
	}
	fmt.Fprintln(c.stdout, job.ID)
	return nil
}

// isTerminal reports whether r is a terminal, where reading a payload would
// wait for typing.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
