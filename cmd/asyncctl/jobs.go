package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// jobStates are the states --state takes, in the order of a job's life.
var jobStates = []ap.JobState{ap.StateWaiting, ap.StateScheduled, ap.StateRunning, ap.StateRetrying, ap.StateSucceeded, ap.StateDeadLettered, ap.StateCancelled}

func jobStateNames() []string {
	out := make([]string, len(jobStates))
	for i, s := range jobStates {
		out[i] = string(s)
	}
	return out
}

func jobsCmd() *command {
	return &command{
		name:    "jobs",
		args:    "",
		summary: "list jobs by queue, state and type, a page at a time, from the broker or the status records; --counts: how many in each state",
		help: `
It changes nothing. With --queue and a --state of waiting, scheduled,
retrying or running, it reads the queue's messages on the broker, without
consuming them, in the order workers get them, where the backend can (every
one but RabbitMQ: see the README's "Where jobs are read from"); their IDs
and types are as the messages carry them. Otherwise (or with --source
status) it reads the status records, which only queues that track status
have (Config.TrackStatus or QueueConfig.TrackStatus on the platforms that
enqueue and work them), as last written, in the order of their IDs, not of
time. The table says on stderr where it read from ("source" in JSON). A
page from the broker shows up to --limit jobs; one from the status records
shows up to --limit jobs (at most
500); it reads at most 5,000 status records, so a filter that matches few
can print a short page, or none, with a cursor: when more may follow it
ends with the --cursor of the next page (on stderr in a table, as "next"
in JSON). --counts prints, instead, how many tracked jobs each queue has in
each state (of --queue alone when given), from at most 20,000 records: when
there are more it says the counts are partial. Exit code 3 when no job
matches (on the first page: a page after a --cursor may be the listing's
empty end).

States: waiting, scheduled, running, retrying, succeeded, dead_lettered,
cancelled. A running job's state is written a poll interval (300 ms) after
its handler starts: a shorter run shows its state before, then its end.

Examples:

	asyncctl jobs --queue emails --state retrying
	asyncctl jobs --queue emails --state waiting --source status
	asyncctl jobs --queue emails --state scheduled --type email.send --limit 20
	asyncctl jobs --queue emails --cursor 0193a3b2-7c1e-7d40-9a55-2f0c4e8b1a77
	asyncctl jobs --counts
	asyncctl jobs --queue emails --state dead_lettered --json | jq -r '.jobs[].id'
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			var (
				q      ap.JobsQuery
				state  string
				counts bool
			)
			fs.StringVar(&q.Queue, "queue", "", "the `QUEUE` whose jobs to list; none: every tracked queue")
			fs.StringVar(&state, "state", "", "only jobs in this `STATE`: "+strings.Join(jobStateNames(), ", "))
			fs.StringVar(&q.Type, "type", "", "only jobs of this job `TYPE`")
			fs.IntVar(&q.Limit, "limit", 50, "show `N` jobs per page (at most 500)")
			fs.StringVar(&q.Cursor, "cursor", "", "start at this `CURSOR`, printed by the previous page")
			fs.BoolVar(&counts, "counts", false, "print how many tracked jobs each queue has in each state")
			fs.Func("source", "read the jobs from `SOURCE`: broker or status (default: the broker for --queue and --state waiting, scheduled, retrying or running, where the backend can read it)", func(v string) error {
				if v != string(ap.SourceBroker) && v != string(ap.SourceStatus) {
					return fmt.Errorf("want broker or status")
				}
				q.Source = ap.JobsSource(v)
				return nil
			})
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) > 0 {
					return usageErrorf("unexpected arguments %q", args)
				}
				if q.Queue != "" || flagSet(fs, "queue") {
					if err := checkQueue("--queue: ", q.Queue); err != nil {
						return err
					}
				}
				if state != "" && !slices.Contains(jobStates, ap.JobState(state)) {
					return usageErrorf("--state %q: want one of %s", field(state), strings.Join(jobStateNames(), ", "))
				}
				q.State = ap.JobState(state)
				if q.Limit < 1 || q.Limit > 500 {
					return usageErrorf("--limit must be 1 to 500")
				}
				if counts {
					if state != "" || q.Type != "" || q.Cursor != "" || flagSet(fs, "limit") || flagSet(fs, "source") {
						return usageErrorf("--counts goes with --queue alone")
					}
					return c.jobCounts(ctx, q.Queue)
				}
				return c.jobsList(ctx, q)
			}
		},
	}
}

var jobsHeader = []string{"ID", "TYPE", "QUEUE", "STATE", "TRIES", "UPDATED", "ERROR"}

func (c *cli) jobsList(ctx context.Context, q ap.JobsQuery) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	pg, err := p.Jobs(ctx, q)
	if errors.Is(err, ap.ErrBadCursor) {
		return usageErrorf("--cursor %q is not one a listing printed", field(q.Cursor))
	}
	if errors.Is(err, ap.ErrInvalidConfig) || errors.Is(err, ap.ErrCannotBrowse) {
		return usageErrorf("--source broker: %s", field(err.Error()))
	}
	if err != nil {
		return err
	}
	fromBroker := pg.Source == ap.SourceBroker
	if c.json {
		page := struct {
			Jobs       []ap.JobStatus `json:"jobs"`
			Next       string         `json:"next,omitempty"`
			Scanned    int            `json:"scanned"`
			Source     ap.JobsSource  `json:"source"`
			Partial    bool           `json:"partial,omitempty"`
			Unreadable int            `json:"unreadable,omitempty"`
		}{Jobs: pg.Jobs, Next: pg.Next, Scanned: pg.Scanned, Source: pg.Source, Partial: pg.Partial, Unreadable: pg.Unreadable}
		if page.Jobs == nil {
			page.Jobs = []ap.JobStatus{}
		}
		if err := writeJSON(c.stdout, page); err != nil {
			return err
		}
	} else if len(pg.Jobs) > 0 {
		now := time.Now()
		rows := make([][]string, len(pg.Jobs))
		for i, st := range pg.Jobs {
			state := field(string(st.State))
			if st.Reason != "" {
				state += " (" + field(string(st.Reason)) + ")"
			}
			at := st.UpdatedAt
			if fromBroker {
				at = st.EnqueuedAt // a message has no status to have been updated
			}
			rows[i] = []string{field(st.ID), field(st.Type), field(st.Queue), state, strconv.Itoa(st.Tries), age(now, at) + " ago", field(firstRunes(st.Error, 60))}
		}
		header := jobsHeader
		if fromBroker {
			header = slices.Clone(jobsHeader)
			header[5] = "ENQUEUED"
		}
		if err := table(c.stdout, header, rows); err != nil {
			return err
		}
	}
	read := "status records"
	if fromBroker {
		read = "messages"
	}
	if !c.json {
		if fromBroker {
			fmt.Fprintf(c.stderr, "from the broker: the queue's %s messages, read without consuming them\n", field(string(q.State)))
		} else {
			fmt.Fprintln(c.stderr, "from status records (queues that track status only)")
		}
		if pg.Partial {
			fmt.Fprintln(c.stderr, "partial: the broker shows only the first few; there may be more")
		}
		if pg.Unreadable > 0 {
			fmt.Fprintf(c.stderr, "skipped %d %s that are not jobs (or too large to show)\n", pg.Unreadable, read)
		}
	}
	if pg.Next != "" && !c.json {
		fmt.Fprintf(c.stderr, "more (%d %s read): add --cursor %s\n", pg.Scanned, read, field(pg.Next))
	}
	if len(pg.Jobs) == 0 && pg.Next == "" && q.Cursor == "" { // a later page may be the empty end of a listing
		if fromBroker {
			return notFoundf("no jobs in queue %s on the broker match", field(q.Queue))
		}
		where := "in any tracked queue"
		if q.Queue != "" {
			where = "in queue " + field(q.Queue)
		}
		return notFoundf("no tracked jobs %s match (only the jobs of queues that track status are listed)", where)
	}
	return nil
}

func (c *cli) jobCounts(ctx context.Context, queue string) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	jc, err := p.JobCounts(ctx, queue)
	if err != nil {
		return err
	}
	if c.json {
		return writeJSON(c.stdout, struct {
			Queues   map[string]map[ap.JobState]int `json:"queues"`
			Scanned  int                            `json:"scanned"`
			Complete bool                           `json:"complete"`
		}{jc.ByQueue, jc.Scanned, jc.Complete})
	}
	if len(jc.ByQueue) == 0 && jc.Complete {
		return notFoundf("no tracked jobs%s (only queues that track status have them)", inQueue(queue))
	}
	names := make([]string, 0, len(jc.ByQueue))
	for q := range jc.ByQueue {
		names = append(names, q)
	}
	slices.Sort(names)
	header := append([]string{"QUEUE"}, strings.Split(strings.ToUpper(strings.Join(jobStateNames(), " ")), " ")...)
	rows := make([][]string, 0, len(names))
	for _, q := range names {
		row := []string{field(q)}
		for _, s := range jobStates {
			row = append(row, strconv.Itoa(jc.ByQueue[q][s]))
		}
		rows = append(rows, row)
	}
	if err := table(c.stdout, header, rows); err != nil {
		return err
	}
	if !jc.Complete {
		fmt.Fprintf(c.stderr, "partial: the counts are of the first %d status records (in the order of job IDs)\n", jc.Scanned)
	}
	return nil
}

func inQueue(q string) string {
	if q == "" {
		return ""
	}
	return " in queue " + field(q)
}

// firstRunes is s cut to at most n runes, with "…" when cut.
func firstRunes(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
