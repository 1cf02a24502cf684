package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
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
		summary: "show queues and their depths: ready, scheduled, in flight, dead",
		help: `
With no queue named, it shows every queue the backend holds: each one that
holds jobs or dead letters, and each one declared (on NATS: once a worker
received from it). Name queues as arguments or with --queue (repeatable)
to show only those. OLDEST READY is how long the oldest ready job has
waited since it became deliverable ("unknown" where the backend cannot
tell; ready_wait_s -1 in JSON); OLDEST DEAD is how long ago the oldest
dead letter died; a paused queue is marked "(paused)", a queue with a paused group
"(group NAME paused, N held)" (a group's held queue is not a queue of its
own). A depth the backend cannot tell
is printed as "-" (-1 in JSON). Exit code 3 when the backend holds no
queue, or does not hold a queue named (a typo is not shown as an empty
queue).

Examples:

	asyncctl queues
	asyncctl queues emails billing
	asyncctl queues --queue emails --json
	asyncctl --url redis://127.0.0.1:6379/0 queues --json | jq -r '.[] | select(.dead > 0) | .queue'
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			var queues listFlag
			fs.Var(&queues, "queue", "a `QUEUE` to show (repeatable); none: every queue")
			return func(ctx context.Context, c *cli, args []string) error {
				names := append(args, queues...)
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
	Queue      string    `json:"queue"`
	Ready      int64     `json:"ready"`
	Scheduled  int64     `json:"scheduled"`
	InFlight   int64     `json:"in_flight"`
	Dead       int64     `json:"dead"`
	Paused     bool      `json:"paused"`
	OldestDead time.Time `json:"oldest_dead,omitzero"`
	// OldestReady is when the oldest ready job became deliverable; absent
	// when none is ready or the backend cannot tell (ReadyWait -1).
	OldestReady time.Time `json:"oldest_ready,omitzero"`
	// ReadyWait is how long, in seconds, the oldest ready job has waited:
	// 0 with none ready, -1 when the backend cannot tell.
	ReadyWait float64     `json:"ready_wait_s"`
	Groups    []groupJSON `json:"groups,omitempty"` // paused groups, and groups with jobs held still
	Error     string      `json:"error,omitempty"`
}

// groupJSON is a queue's paused (or still held) group as --json prints it.
type groupJSON struct {
	Group  string `json:"group"`
	Paused bool   `json:"paused"`
	Held   int64  `json:"held"` // jobs on its held queue; -1: unknown
}

func groupsJSON(gs []ap.HeldGroup) []groupJSON {
	var out []groupJSON
	for _, g := range gs {
		out = append(out, groupJSON{Group: g.Group, Paused: g.Paused, Held: g.Held})
	}
	return out
}

// groupsNote says, after a queue's name, which of its groups are paused
// and how many jobs each holds: " (group acme paused, 3 held)".
func groupsNote(gs []groupJSON) string {
	if len(gs) == 0 {
		return ""
	}
	parts := make([]string, len(gs))
	for i, g := range gs {
		state := "paused"
		if !g.Paused {
			state = "resumed"
		}
		parts[i] = "group " + field(g.Group) + " " + state
		if g.Held >= 0 {
			parts[i] += ", " + strconv.FormatInt(g.Held, 10) + " held"
		}
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

// queueInfos returns the named queues' figures, or every queue's when none
// is named.
func queueInfos(ctx context.Context, p *ap.Platform, names []string) ([]ap.QueueInfo, error) {
	if len(names) == 0 {
		qs, err := p.Queues(ctx)
		if errors.Is(err, errors.ErrUnsupported) {
			return nil, fmt.Errorf("%w; name the queues instead (asyncctl queues QUEUE...)", err)
		}
		return qs, err
	}
	out := make([]ap.QueueInfo, 0, len(names))
	for _, q := range names {
		s, err := p.Stats(ctx, q)
		if errors.Is(err, ap.ErrInvalidJob) {
			return nil, &exitErr{exitUsage, err}
		}
		if err != nil {
			return nil, err
		}
		qi := ap.QueueInfo{Name: q, QueueStats: s}
		if qi.Groups, err = p.HeldGroups(ctx, q); err != nil && !errors.Is(err, ap.ErrNoStore) {
			return nil, err
		}
		if s.Dead != 0 {
			page, err := p.DeadLetters(ctx, q, "", 1)
			if err != nil {
				return nil, err
			}
			if len(page.Letters) > 0 {
				qi.OldestDead = page.Letters[0].DeadAt
			}
		}
		out = append(out, qi)
	}
	return out, nil
}

func (c *cli) queues(ctx context.Context, names []string) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	if err := checkKnown(ctx, p, names, ""); err != nil {
		return err
	}
	qs, err := queueInfos(ctx, p, names)
	if err != nil {
		return err
	}
	out := make([]queueJSON, len(qs))
	failed := 0
	now := time.Now()
	for i, q := range qs {
		out[i] = queueJSON{Queue: q.Name, Ready: q.Ready, Scheduled: q.Scheduled, InFlight: q.InFlight, Dead: q.Dead, Paused: q.Paused, OldestDead: q.OldestDead,
			OldestReady: q.OldestReady, ReadyWait: -1, Groups: groupsJSON(q.Groups)}
		if wait, ok := q.ReadyAge(now); ok {
			out[i].ReadyWait = wait.Seconds()
		}
		if q.Err != nil {
			out[i] = queueJSON{Queue: q.Name, Ready: -1, Scheduled: -1, InFlight: -1, Dead: -1, ReadyWait: -1, Error: c.redact(q.Err.Error())}
			failed++
		}
	}
	if c.json {
		if err := writeJSON(c.stdout, out); err != nil {
			return err
		}
	} else if len(out) > 0 {
		rows := make([][]string, len(out))
		for i, s := range out {
			name := field(s.Queue)
			if s.Paused {
				name += " (paused)"
			}
			name += groupsNote(s.Groups)
			rows[i] = []string{name, count(s.Ready), readyAge(now, qs[i].QueueStats, "-"), count(s.Scheduled), count(s.InFlight), count(s.Dead), age(now, s.OldestDead)}
		}
		if err := table(c.stdout, []string{"QUEUE", "READY", "OLDEST READY", "SCHEDULED", "IN FLIGHT", "DEAD", "OLDEST DEAD"}, rows); err != nil {
			return err
		}
		for _, s := range out {
			if s.Error != "" {
				fmt.Fprintf(c.stderr, "queue %s: %s\n", field(s.Queue), field(s.Error))
			}
		}
	}
	switch {
	case failed > 0:
		return fmt.Errorf("the figures of %d of %s could not be read", failed, plural(len(out), "queue"))
	case len(out) == 0:
		return notFoundf("the backend holds no queue")
	}
	return nil
}

func enqueueCmd() *command {
	return &command{
		name:    "enqueue",
		args:    "--type TYPE [--payload TEXT | --file PATH | < PAYLOAD] | --from JOBS.jsonl",
		summary: "enqueue one job, or every job of a JSON-lines file",
		help: `
The payload comes from --payload, from --file (- for stdin), or else from
stdin when it is not a terminal; give --payload '' for an empty one. It
prints the job's ID.

With --from it enqueues every line of a JSON-lines file (- for stdin), one
job a line, as "dead pop --yes --json" writes them: {"type": ...,
"queue": ..., "id": ..., "headers": {...}, "payload": BASE64} or
"payload_text": TEXT instead of "payload"; other fields are ignored. --type
and --queue are the defaults of lines without them; --delay, --deadline,
--retry-limit, --poison-limit and --header apply to every job. A line's id
is kept unless --new-ids (on NATS a job enqueued again under its ID within
the two-minute duplicate window of its first enqueue is dropped as a
duplicate). It shows its progress on stderr when it is a terminal; Ctrl-C
stops it between two lines and says which --skip goes on from there.
Exit code 130 when interrupted.

The workers' platforms decide which queues track status; asyncctl cannot
tell. On a queue that does, give --track-status: asyncctl then writes each
job's status as it enqueues it (the backend needs a store), so that "job
show" finds the job before a worker takes it. Without it, the job has a
status from the moment a worker takes it.

Examples:

	asyncctl enqueue --type email.send --queue emails --payload '{"to":"ann@example.com"}'
	asyncctl enqueue --type report.build --file report.json --delay 10m
	echo -n hello | asyncctl enqueue --type greet --retry-limit 0 --header tenant=acme
	asyncctl enqueue --from popped.jsonl --new-ids
	asyncctl enqueue --from popped.jsonl --skip 1200
	asyncctl enqueue --type report.build --queue reports --payload '{}' --track-status
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
			fs.StringVar(&e.from, "from", "", "enqueue every job of this JSON-lines `FILE` (- for stdin)")
			fs.IntVar(&e.skip, "skip", 0, "with --from, skip the first `N` lines (to go on after an interruption)")
			fs.BoolVar(&e.newIDs, "new-ids", false, "with --from, give every job a new ID")
			track := fs.Bool("track-status", false, "write each job's status (waiting, or scheduled) now, for a queue whose workers track status: job show finds it before a worker takes it")
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) > 0 {
					return usageErrorf("unexpected arguments %q", args)
				}
				c.trackStatus = *track
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
	from                          string // --from: a JSON-lines file of jobs
	skip                          int
	newIDs                        bool
}

func (c *cli) enqueue(ctx context.Context, e enqueueOpts) error {
	if e.from != "" {
		return c.enqueueFrom(ctx, e)
	}
	if e.skip != 0 || e.newIDs {
		return usageErrorf("--skip and --new-ids go with --from")
	}
	if e.typ == "" {
		return usageErrorf("--type is required")
	}
	if err := checkQueue("--queue: ", e.queue); err != nil {
		return err
	}
	if e.payloadSet && e.file != "" {
		return usageErrorf("give --payload or --file, not both")
	}
	headers, err := e.check()
	if err != nil {
		return err
	}
	job := &ap.Job{ID: e.id, Type: e.typ, Queue: e.queue, Headers: headers}
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
	e.apply(job, time.Now())

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
