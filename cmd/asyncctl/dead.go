package main

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// filter selects dead letters by the flags --type, --reason and --older-than.
type filter struct {
	typ       string
	reason    string
	olderThan time.Duration
	ids       map[string]bool // when non-nil, only these IDs
	now       time.Time
}

func (f *filter) flags(fs *flag.FlagSet) {
	fs.StringVar(&f.typ, "type", "", "only dead letters of this job `TYPE`")
	fs.StringVar(&f.reason, "reason", "", "only dead letters with this `REASON`: "+strings.Join(reasonNames(), ", "))
	fs.DurationVar(&f.olderThan, "older-than", 0, "only dead letters dead for longer than `DURATION` (90m, 24h)")
}

func (f *filter) set() bool { return f.typ != "" || f.reason != "" || f.olderThan > 0 }

func (f *filter) check() error {
	if f.olderThan < 0 {
		return usageErrorf("--older-than must not be negative")
	}
	if f.reason != "" && !knownReason(f.reason) {
		return usageErrorf("--reason %q is not one of %s", f.reason, strings.Join(reasonNames(), ", "))
	}
	f.now = time.Now()
	return nil
}

func (f *filter) match(dl ap.DeadLetter) bool {
	return (f.typ == "" || dl.Job.Type == f.typ) &&
		(f.reason == "" || string(dl.Reason) == f.reason) &&
		(f.olderThan == 0 || f.now.Sub(dl.DeadAt) > f.olderThan) &&
		(f.ids == nil || f.ids[dl.Job.ID])
}

func reasonNames() []string {
	rs := ap.Reasons()
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r)
	}
	return out
}

func knownReason(s string) bool { return slices.Contains(reasonNames(), s) }

// listPage is how many records asyncctl reads from the backend at a time.
const listPage = 100

// The cursor asyncctl prints is the backend's cursor of a page and how many
// records of that page were already shown, so that a filtered listing can
// stop anywhere in a page and resume there.
func encodeCursor(backend string, skip int) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.Itoa(skip) + ":" + backend))
}

func decodeCursor(s string) (backend string, skip int, err error) {
	if s == "" {
		return "", 0, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		n, rest, ok := strings.Cut(string(b), ":")
		if skip, err = strconv.Atoi(n); ok && err == nil && skip >= 0 {
			return rest, skip, nil
		}
	}
	return "", 0, usageErrorf("--cursor %q is not a cursor printed by dead list", s)
}

// collect returns up to limit (0: every) dead letters of the queue that
// match f, starting at cursor, and the cursor of what follows ("" at the
// end).
func collect(ctx context.Context, p *ap.Platform, queue string, f *filter, cursor string, limit int) ([]ap.DeadLetter, string, error) {
	bc, skip, err := decodeCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	var out []ap.DeadLetter
	for {
		page, err := p.DeadLetters(ctx, queue, bc, listPage)
		if err != nil {
			return nil, "", err
		}
		for i := skip; i < len(page.Letters); i++ {
			if !f.match(page.Letters[i]) {
				continue
			}
			if limit > 0 && len(out) == limit {
				return out, encodeCursor(bc, i), nil
			}
			out = append(out, page.Letters[i])
		}
		if page.Next == "" {
			return out, "", nil
		}
		bc, skip = page.Next, 0
	}
}

func queueFlag(fs *flag.FlagSet, q *string) {
	fs.StringVar(q, "queue", ap.DefaultQueue, "the `QUEUE` whose dead letters to work on")
}

// lookFlag is the --queue of the commands that only look (dead list, dead
// show): none means every queue.
func lookFlag(fs *flag.FlagSet, q *string) {
	fs.StringVar(q, "queue", "", "the `QUEUE` whose dead letters to look at; none: every queue")
}

// flagSet reports whether the flag was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// deadQueues returns the queues that hold dead letters (or cannot tell),
// of every queue the backend lists, and how many queues it lists. A
// backend that cannot list its queues is a usage error: name one.
func deadQueues(ctx context.Context, p *ap.Platform) (withDead []string, all int, err error) {
	qs, err := p.Queues(ctx)
	if errors.Is(err, errors.ErrUnsupported) {
		return nil, 0, usageErrorf("this backend cannot list its queues: name one with --queue")
	}
	if err != nil {
		return nil, 0, err
	}
	for _, q := range qs {
		if q.Err != nil {
			return nil, 0, fmt.Errorf("queue %q: %w", q.Name, q.Err)
		}
		if q.Dead != 0 { // -1: the backend cannot tell, so look
			withDead = append(withDead, q.Name)
		}
	}
	return withDead, len(qs), nil
}

// inQueues says which queues a search covered, for a "found nothing".
func inQueues(queue string, all int) string {
	if queue != "" {
		return fmt.Sprintf("in queue %q", queue)
	}
	return fmt.Sprintf("in any of the %s the backend holds", plural(all, "queue"))
}

// checkQueue refuses a bad queue name as a bad command line (exit 2), before
// the backend is opened.
func checkQueue(flag, q string) error {
	if err := driver.CheckQueue(q); err != nil {
		return usageErrorf("%s%w", flag, err)
	}
	return nil
}

func deadListCmd() *command {
	return &command{
		name:    "dead list",
		args:    "",
		summary: "list dead letters, oldest first, a page at a time",
		help: `
It changes nothing. A page shows --limit records; when more follow, it ends
with the --cursor that shows the next page (on stderr in a table, as "next"
in JSON). --all shows every record at once. Without --queue it looks in
every queue the backend holds: when one holds dead letters it lists that
one (and says which on stderr), when several do it names them and asks for
--queue (exit code 2). Exit code 3 when no record matches, in the queue
named or in any queue.

Examples:

	asyncctl dead list --queue emails
	asyncctl dead list --queue emails --reason poisoned --older-than 24h
	asyncctl dead list --queue emails --type email.send --limit 20 --cursor MDo
	asyncctl dead list --queue emails --all --json | jq -r '.dead_letters[].id'
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			var (
				queue, cursor string
				limit         int
				all           bool
				f             filter
			)
			lookFlag(fs, &queue)
			f.flags(fs)
			fs.IntVar(&limit, "limit", 50, "show `N` records per page")
			fs.StringVar(&cursor, "cursor", "", "start at this `CURSOR`, printed by the previous page")
			fs.BoolVar(&all, "all", false, "list every record, in one page")
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) > 0 {
					return usageErrorf("unexpected arguments %q", args)
				}
				if limit < 1 {
					return usageErrorf("--limit must be 1 or more")
				}
				if all {
					limit = 0
				}
				if err := f.check(); err != nil {
					return err
				}
				if queue != "" || flagSet(fs, "queue") {
					if err := checkQueue("--queue: ", queue); err != nil {
						return err
					}
				}
				if _, _, err := decodeCursor(cursor); err != nil {
					return err
				}
				if cursor != "" && queue == "" {
					return usageErrorf("--cursor goes with the --queue of the listing that printed it")
				}
				return c.deadList(ctx, queue, &f, cursor, limit)
			}
		},
	}
}

func (c *cli) deadList(ctx context.Context, queue string, f *filter, cursor string, limit int) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	all, chosen := 0, false
	if queue == "" {
		var qs []string
		if qs, all, err = deadQueues(ctx, p); err != nil {
			return err
		}
		switch len(qs) {
		case 0:
			return notFoundf("no dead letters %s", inQueues("", all))
		case 1:
			queue, chosen = qs[0], true
			fmt.Fprintf(c.stderr, "queue %s (the only one with dead letters)\n", field(queue))
		default:
			return usageErrorf("%d queues hold dead letters: %s; name one with --queue", len(qs), strings.Join(fields(qs), ", "))
		}
	}
	dls, next, err := collect(ctx, p, queue, f, cursor, limit)
	if err != nil {
		return err
	}
	if c.json {
		page := struct {
			Queue       string     `json:"queue"`
			DeadLetters []deadJSON `json:"dead_letters"`
			Next        string     `json:"next,omitempty"`
		}{Queue: queue, DeadLetters: make([]deadJSON, len(dls)), Next: next}
		for i, dl := range dls {
			page.DeadLetters[i] = toJSON(dl)
		}
		if err := writeJSON(c.stdout, page); err != nil {
			return err
		}
	} else if len(dls) > 0 {
		if err := table(c.stdout, deadHeader, deadRows(time.Now(), dls)); err != nil {
			return err
		}
		switch {
		case next != "" && chosen:
			fmt.Fprintf(c.stderr, "more: add --queue %s --cursor %s\n", field(queue), next)
		case next != "":
			fmt.Fprintf(c.stderr, "more: add --cursor %s\n", next)
		}
	}
	if len(dls) == 0 {
		return notFoundf("no dead letters in queue %q%s", queue, matching(f))
	}
	return nil
}

func matching(f *filter) string {
	if f.set() {
		return " match the filter"
	}
	return ""
}

func deadShowCmd() *command {
	return &command{
		name:    "dead show",
		args:    "ID",
		summary: "show one dead letter in full: payload, headers, error, history",
		help: `
A payload that is not text is shown as a hex dump, cut at 4 KiB; --json
prints it all (base64, and as text in payload_text when it is text). Records
sharing an ID (a rare duplicate) are all shown. Without --queue it looks in every queue that holds dead letters. Exit
code 3 when there is none.

Examples:

	asyncctl dead show --queue emails 0193a3b2-7c1e-7d40-9a55-2f0c4e8b1a77
	asyncctl dead show --queue emails 0193a3b2-7c1e-7d40-9a55-2f0c4e8b1a77 --json | jq -r .payload_text
	asyncctl dead show 0193a3b2-7c1e-7d40-9a55-2f0c4e8b1a77
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			var queue string
			lookFlag(fs, &queue)
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) != 1 {
					return usageErrorf("give one dead letter ID")
				}
				if queue != "" || flagSet(fs, "queue") {
					if err := checkQueue("--queue: ", queue); err != nil {
						return err
					}
				}
				return c.deadShow(ctx, queue, args[0])
			}
		},
	}
}

func (c *cli) deadShow(ctx context.Context, queue, id string) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	queues, all := []string{queue}, 0
	if queue == "" {
		if queues, all, err = deadQueues(ctx, p); err != nil {
			return err
		}
	}
	var dls []ap.DeadLetter
	for _, q := range queues {
		found, _, err := collect(ctx, p, q, &filter{ids: map[string]bool{id: true}}, "", 0)
		if err != nil {
			return err
		}
		dls = append(dls, found...)
	}
	if len(dls) == 0 {
		return notFoundf("no dead letter %q %s", id, inQueues(queue, all))
	}
	for i, dl := range dls {
		if c.json {
			if err := writeJSON(c.stdout, toJSON(dl)); err != nil {
				return err
			}
			continue
		}
		if i > 0 {
			fmt.Fprintln(c.stdout)
		}
		printDead(c.stdout, time.Now(), dl)
	}
	return nil
}

func deadPopCmd() *command {
	return &command{
		name:    "dead pop",
		args:    "",
		summary: "work through dead letters one at a time: pop, keep or redrive each",
		help: `
It shows the oldest dead letter and asks on stderr, reading the answer from
stdin:

	p  pop: delete it and show the next one
	r  redrive: move it back to its queue as a fresh job, and show the next one
	k  keep: leave it where it is and stop (it stays the oldest, so it would come next again)
	q  quit: the same as keep

End of input is quit. While a record is shown no other "dead pop" gets it.
With --yes it asks nothing and pops up to --max records (all with 0),
printing each one before it is deleted: with --json, one JSON object per
line, to save them before they go (enqueue --from re-enqueues such a
file). On a terminal it shows its progress on stderr; Ctrl-C stops it
between two records. Exit code 3 when the dead-letter queue is empty, 130
when interrupted.

Examples:

	asyncctl dead pop --queue emails
	asyncctl dead pop --queue emails --yes --max 100 --json >> popped.jsonl
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			var (
				queue string
				yes   bool
				maxN  int
			)
			queueFlag(fs, &queue)
			fs.BoolVar(&yes, "yes", false, "pop without asking")
			fs.IntVar(&maxN, "max", 0, "with --yes, pop at most `N` records; 0 for all")
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) > 0 {
					return usageErrorf("unexpected arguments %q", args)
				}
				if maxN < 0 {
					return usageErrorf("--max must be 0 or more")
				}
				if err := checkQueue("--queue: ", queue); err != nil {
					return err
				}
				return c.deadPop(ctx, queue, yes, maxN)
			}
		},
	}
}

// popAction is what the user chose for the record shown.
type popAction int

const (
	popIt popAction = iota
	keepIt
	redriveIt
)

func (c *cli) deadPop(ctx context.Context, queue string, yes bool, maxN int) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	if yes {
		return c.popAll(c.interruptible(ctx), p, queue, maxN)
	}
	seen, popped, redriven := 0, 0, 0
	defer func() {
		if seen > 0 {
			fmt.Fprintf(c.stderr, "popped %d, redrove %d dead letters of queue %q\n", popped, redriven, queue)
		}
	}()
	for {
		var action popAction
		var id string
		err := p.NextDeadLetter(ctx, queue, func(ctx context.Context, dl ap.DeadLetter) (bool, error) {
			seen++
			id = dl.Job.ID
			if c.json {
				if err := json1(c.stdout, toJSON(dl)); err != nil {
					return false, err
				}
			} else {
				printDead(c.stdout, time.Now(), dl)
			}
			var err error
			action, err = c.ask(ctx)
			return action == popIt, err
		})
		switch {
		case errors.Is(err, ap.ErrNoDeadLetters):
			if seen == 0 {
				return notFoundf("no dead letters in queue %q", queue)
			}
			fmt.Fprintf(c.stderr, "the dead-letter queue %q is empty\n", queue)
			return nil
		case errors.Is(err, ap.ErrLeaseLost):
			return fmt.Errorf("%w (the backend released the record while it was shown, so another caller may have it; nothing was popped)", err)
		case err != nil:
			return err
		}
		switch action {
		case popIt:
			popped++
		case keepIt:
			return nil
		case redriveIt:
			n, err := p.Redrive(ctx, queue, id)
			if err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("dead letter %q was not redriven: it is no longer in queue %q", id, queue)
			}
			redriven++
		}
	}
}

// popAll pops up to maxN records (every one with 0), printing each before
// it is deleted, with its progress on a terminal; Ctrl-C stops it between
// two records.
func (c *cli) popAll(in *interruption, p *ap.Platform, queue string, maxN int) error {
	s, err := p.Stats(in.ctx, queue)
	if err != nil {
		return err
	}
	total := s.Dead
	if maxN > 0 && (total < 0 || total > int64(maxN)) {
		total = int64(maxN)
	}
	prog := c.progress(total, "popping")
	defer prog.done()
	popped := 0
	for maxN == 0 || popped < maxN {
		if in.stop() {
			prog.done()
			return interrupted("popped %d dead letters of queue %q; the others are still there", popped, queue)
		}
		err := p.NextDeadLetter(in.work, queue, func(_ context.Context, dl ap.DeadLetter) (bool, error) {
			var err error
			prog.print(func() { err = c.printPopped(dl) })
			return err == nil, err
		})
		switch {
		case errors.Is(err, ap.ErrNoDeadLetters):
			prog.done()
			if popped == 0 {
				return notFoundf("no dead letters in queue %q", queue)
			}
			fmt.Fprintf(c.stderr, "the dead-letter queue %q is empty\n", queue)
			return nil
		case errors.Is(err, ap.ErrLeaseLost):
			return fmt.Errorf("after popping %d: %w (the backend released the record while it was printed, so another caller may have it; it was not deleted)", popped, err)
		case err != nil:
			return fmt.Errorf("after popping %d: %w", popped, err)
		}
		popped++
		prog.add(1)
	}
	return nil
}

// ask reads the user's choice for the record shown.
func (c *cli) ask(ctx context.Context) (popAction, error) {
	for {
		fmt.Fprint(c.stderr, "pop, redrive, keep or quit? [p/r/k/q] ")
		ans, err := c.line(ctx)
		if errors.Is(err, io.EOF) {
			fmt.Fprintln(c.stderr)
			return keepIt, nil
		}
		if err != nil {
			return keepIt, fmt.Errorf("reading the answer: %w", err)
		}
		switch strings.ToLower(ans) {
		case "p", "pop":
			return popIt, nil
		case "r", "redrive":
			return redriveIt, nil
		case "k", "keep", "q", "quit":
			return keepIt, nil
		}
	}
}

func (c *cli) printPopped(dl ap.DeadLetter) error {
	if c.json {
		return json1(c.stdout, toJSON(dl))
	}
	fmt.Fprintf(c.stdout, "popped %s %s %s: %s\n", field(dl.Job.ID), field(dl.Job.Type), field(string(dl.Reason)), shorten(dl.Error, 60))
	return nil
}

func deadRedriveCmd() *command {
	return &command{
		name:    "dead redrive",
		args:    "[ID...] | --type/--reason/--older-than ... | --all",
		summary: "move dead letters back to their queue as fresh jobs",
		help: `
Redrives the records named by ID, the records matching the filter flags, or
every record with --all. A redriven job starts again with its counters at 0;
its error history is kept. --rate throttles it, so a fixed dependency is not
flooded at once. Records that were not jobs (raw bytes) cannot be redriven.
The records are listed first, then redriven a chunk at a time, with the
progress (done/total, rate, time left) on stderr when it is a terminal.
Ctrl-C stops it between two chunks, says how many were redriven, and
leaves the others dead letters: none is lost or redriven twice. Exit code
3 when nothing was redriven, 130 when interrupted.

Examples:

	asyncctl dead redrive --queue emails 0193a3b2-7c1e-7d40-9a55-2f0c4e8b1a77
	asyncctl dead redrive --queue emails --reason retries_exceeded --type email.send
	asyncctl dead redrive --queue emails --all --rate 20
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			var (
				queue string
				all   bool
				rate  float64
				f     filter
			)
			queueFlag(fs, &queue)
			f.flags(fs)
			fs.BoolVar(&all, "all", false, "redrive every dead letter of the queue")
			fs.Float64Var(&rate, "rate", 0, "redrive at most `N` jobs a second; 0: no limit")
			return func(ctx context.Context, c *cli, args []string) error {
				modes := 0
				for _, on := range []bool{len(args) > 0, f.set(), all} {
					if on {
						modes++
					}
				}
				if modes != 1 {
					return usageErrorf("give dead letter IDs, a filter (--type, --reason, --older-than) or --all: one of them")
				}
				if rate < 0 {
					return usageErrorf("--rate must be 0 or more")
				}
				if err := f.check(); err != nil {
					return err
				}
				if err := checkQueue("--queue: ", queue); err != nil {
					return err
				}
				if len(args) > 0 {
					f.ids = map[string]bool{}
					for _, id := range args {
						f.ids[id] = true
					}
				}
				return c.deadRedrive(ctx, queue, &f, rate)
			}
		},
	}
}

func (c *cli) deadRedrive(ctx context.Context, queue string, f *filter, rate float64) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	// The records are listed first, and redriven by record ID a chunk at
	// a time: records dead-lettered meanwhile are left for the next run.
	dls, _, err := collect(ctx, p, queue, f, "", 0)
	if err != nil {
		return err
	}
	var ids []string
	found := map[string]bool{} // job IDs
	seen := map[string]bool{}  // record IDs
	for _, dl := range dls {
		found[dl.Job.ID] = true
		if dl.Raw == nil && !seen[dl.ID] {
			seen[dl.ID] = true
			ids = append(ids, dl.ID)
		}
	}
	var missing []string
	for id := range f.ids {
		if !found[id] {
			missing = append(missing, id)
		}
	}
	sort.Strings(missing)
	if len(ids) == 0 {
		for _, id := range missing {
			fmt.Fprintf(c.stderr, "no dead letter %q in queue %q\n", id, queue)
		}
		return notFoundf("no dead letters to redrive in queue %q%s", queue, matching(f))
	}
	in := c.interruptible(ctx)
	prog := c.progress(int64(len(ids)), "redriving")
	n, err := redrive(in, p, queue, ids, rate, prog)
	prog.done()
	stopped := errors.Is(err, errStopped)
	if err != nil && !stopped {
		return fmt.Errorf("after redriving %d of %d: %w", n, len(ids), err)
	}
	for _, id := range missing {
		fmt.Fprintf(c.stderr, "no dead letter %q in queue %q\n", id, queue)
	}
	if c.json {
		if err := writeJSON(c.stdout, struct {
			Queue       string   `json:"queue"`
			Redriven    int      `json:"redriven"`
			Of          int      `json:"of"`
			Interrupted bool     `json:"interrupted,omitempty"`
			Missing     []string `json:"missing,omitempty"`
		}{queue, n, len(ids), stopped, missing}); err != nil {
			return err
		}
	} else if stopped {
		fmt.Fprintf(c.stdout, "redrove %d of %d dead letters to queue %q\n", n, len(ids), queue)
	} else {
		fmt.Fprintf(c.stdout, "redrove %d dead letters to queue %q\n", n, queue)
	}
	if stopped {
		return interrupted("redrove %d of %d dead letters to queue %q; the other %d are still dead letters (run the command again to go on)", n, len(ids), queue, len(ids)-n)
	}
	if n == 0 {
		return notFoundf("nothing redriven")
	}
	return nil
}

// errStopped is returned by a long operation that Ctrl-C stopped between
// two records.
var errStopped = errors.New("stopped")

// redrive redrives the records ids (record IDs) a chunk at a time, at most
// rate a second when rate > 0, and returns how many jobs it enqueued. It
// returns errStopped when Ctrl-C stopped it between two chunks; a chunk
// under way is finished first (its jobs are enqueued, then its records
// deleted), so nothing is lost or redriven twice. One RedriveWith call lists
// the dead-letter queue once for all the chunks.
func redrive(in *interruption, p *ap.Platform, queue string, ids []string, rate float64, prog *progress) (int, error) {
	// About twenty chunks of 100 to 1,000 records: few enough to cost little,
	// enough for the progress display and Ctrl-C to act between them.
	chunk := min(max(100, (len(ids)+19)/20), 1000)
	var pause time.Duration
	if rate > 0 {
		// Chunks of about a second's worth, each followed by its share
		// of time.
		chunk = max(1, int(rate))
		pause = time.Duration(float64(chunk) / rate * float64(time.Second))
	}
	if !in.wait(0) {
		return 0, errStopped
	}
	shown := 0
	next := time.Now().Add(pause)
	n, err := p.RedriveWith(in.work, queue, ap.RedriveOptions{
		Chunk: chunk,
		Progress: func(done int) error {
			prog.add(done - shown)
			shown = done
			if done >= len(ids) {
				return nil
			}
			if !in.wait(time.Until(next)) {
				return errStopped
			}
			next = next.Add(pause)
			return nil
		},
	}, ids...)
	if errors.Is(err, errStopped) {
		return n, errStopped
	}
	return n, err
}

func deadPurgeCmd() *command {
	return &command{
		name:    "dead purge",
		args:    "",
		summary: "delete every dead letter of a queue, for good",
		help: `
It asks first (on stderr, reading the answer from stdin) unless --yes is
given, and deletes the records it counted then, one at a time, showing its
progress on a terminal; Ctrl-C stops it between two records and says how
many it deleted. --at-once deletes every record in one backend call
instead (much faster on Redis and RabbitMQ for very many records, with no
progress; it cannot be stopped halfway). Consider
"dead pop --yes --json > saved.jsonl" first to keep a copy. Exit code 3
when there was nothing to delete, 4 when the answer was no, 130 when
interrupted.

Examples:

	asyncctl dead purge --queue emails
	asyncctl dead purge --queue emails --yes --json
	asyncctl dead purge --queue emails --yes --at-once
`,
		setup: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			var (
				queue       string
				yes, atOnce bool
			)
			queueFlag(fs, &queue)
			fs.BoolVar(&yes, "yes", false, "do not ask")
			fs.BoolVar(&atOnce, "at-once", false, "delete them in one backend call: faster on Redis and RabbitMQ, but with no progress, and Ctrl-C cannot stop it halfway")
			return func(ctx context.Context, c *cli, args []string) error {
				if len(args) > 0 {
					return usageErrorf("unexpected arguments %q", args)
				}
				if err := checkQueue("--queue: ", queue); err != nil {
					return err
				}
				return c.deadPurge(ctx, queue, yes, atOnce)
			}
		},
	}
}

func (c *cli) deadPurge(ctx context.Context, queue string, yes, atOnce bool) error {
	p, closeFn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeFn()
	s, err := p.Stats(ctx, queue)
	if err != nil {
		return err
	}
	if s.Dead == 0 {
		return notFoundf("no dead letters in queue %q", queue)
	}
	if !yes {
		what := "every dead letter"
		if s.Dead > 0 {
			what = fmt.Sprintf("%d dead letters", s.Dead)
		}
		ok, err := c.confirm(ctx, fmt.Sprintf("Delete %s of queue %q for good?", what, queue))
		if err != nil {
			return err
		}
		if !ok {
			return &exitErr{exitDeclined, errors.New("nothing deleted")}
		}
	}
	var n int
	stopped := false
	if atOnce {
		n, err = p.PurgeDeadLetters(context.WithoutCancel(ctx), queue)
	} else {
		n, err = c.purge(c.interruptible(ctx), p, queue, s.Dead)
		stopped = errors.Is(err, errStopped)
	}
	if err != nil && !stopped {
		return fmt.Errorf("after deleting %d: %w", n, err)
	}
	if c.json {
		if err := writeJSON(c.stdout, struct {
			Queue       string `json:"queue"`
			Purged      int    `json:"purged"`
			Interrupted bool   `json:"interrupted,omitempty"`
		}{queue, n, stopped}); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(c.stdout, "deleted %d dead letters of queue %q\n", n, queue)
	}
	if stopped {
		return interrupted("deleted %d dead letters of queue %q; the others are still there", n, queue)
	}
	if n == 0 {
		return notFoundf("no dead letters in queue %q", queue)
	}
	return nil
}

// purge deletes up to total records (every one with total -1), oldest
// first, one at a time, and returns how many it deleted. It returns
// errStopped when Ctrl-C stopped it between two records.
func (c *cli) purge(in *interruption, p *ap.Platform, queue string, total int64) (int, error) {
	prog := c.progress(total, "deleting")
	defer prog.done()
	n := 0
	for total < 0 || int64(n) < total {
		if in.stop() {
			return n, errStopped
		}
		err := p.NextDeadLetter(in.work, queue, func(context.Context, ap.DeadLetter) (bool, error) { return true, nil })
		if errors.Is(err, ap.ErrNoDeadLetters) {
			break // the rest, if any, are held by "dead pop"s
		}
		if err != nil {
			return n, err
		}
		n++
		prog.add(1)
	}
	return n, nil
}
