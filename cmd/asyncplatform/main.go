// Command asyncplatform runs a demonstration of asyncplatform's failure
// handling on the embedded in-memory backend, or on a SQLite file:
//
//	go run ./cmd/asyncplatform demo
//	go run ./cmd/asyncplatform demo --backend sqlite [--db jobs.db]
//
// It enqueues a mix of jobs (one succeeds, one fails twice then succeeds, one
// always fails, one has invalid input, one panics, one is rejected while a
// dependency is "down", one crashes its worker process every time), shows
// every attempt with its try count, then drains the dead-letter queue with
// NextDeadLetter and prints each record.
//
// On SQLite the demo process enqueues the jobs into the file (a new one in
// a temporary directory unless --db names one), closes it and exits
// before working any; a new demo process, which it starts, finds the jobs
// in the file and works them: the jobs survive a restart.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/backend/sqlite"
	"github.com/asyncplatform/asyncplatform/driver"
)

func main() {
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: asyncplatform demo [-v] [--backend memory|sqlite] [--db path]\n\n"+
			"demo  runs a tour of the failure handling on the in-memory backend, or on a SQLite file\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() < 1 || flag.Arg(0) != "demo" {
		flag.Usage()
		os.Exit(2)
	}
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	var o options
	fs.BoolVar(&o.verbose, "v", false, "also print the platform's own debug log")
	fs.StringVar(&o.backend, "backend", "memory", "memory, or sqlite: jobs in a database file that outlives the process")
	fs.StringVar(&o.db, "db", "", "with --backend sqlite: the database file (default: a new one in a temporary directory)")
	fs.BoolVar(&o.resume, "resume", false, "with --backend sqlite: work the jobs a previous demo process left in --db, enqueue none")
	_ = fs.Parse(flag.Args()[1:])
	if fs.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(context.Background(), os.Stdout, o); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// options are the demo's flags.
type options struct {
	verbose bool
	backend string // "memory" or "sqlite"
	db      string // the SQLite file
	resume  bool   // work the jobs in db, enqueue none
}

// run runs the demo on the backend o names.
func run(ctx context.Context, out io.Writer, o options) error {
	switch o.backend {
	case "memory", "":
		return demo(ctx, out, o.verbose)
	case "sqlite":
		if o.resume {
			if o.db == "" {
				return errors.New("--resume needs --db")
			}
			return demoOn(ctx, out, o.verbose, sqliteWorld(o.db), false)
		}
		return demoSQLite(ctx, out, o)
	default:
		return fmt.Errorf("--backend %q: want memory or sqlite", o.backend)
	}
}

// demoSQLite enqueues the jobs into the file and exits, in effect: it
// closes the file and starts a new demo process (this program again) that
// works them.
func demoSQLite(ctx context.Context, out io.Writer, o options) error {
	if o.db == "" {
		dir, err := os.MkdirTemp("", "asyncplatform-demo")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.db = filepath.Join(dir, "jobs.db")
	}
	if err := demoOn(ctx, out, o.verbose, sqliteWorld(o.db), true); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	args := []string{"demo", "--backend", "sqlite", "--db", o.db, "--resume"}
	if o.verbose {
		args = append(args, "-v")
	}
	fmt.Fprintf(out, "\nThis process (pid %d) has closed %s without working a job, and ends here. A new demo process opens the file:\n\n", os.Getpid(), o.db)
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Stdout, cmd.Stderr = out, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("the new demo process: %w", err)
	}
	return nil
}

// printer serialises output lines from concurrent workers.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *printer) f(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format+"\n", args...)
}

const queue = "demo"

// world is where the demo's "processes" connect: each connect is a new
// connection to the jobs (a worker process's), which Close cuts.
type world struct {
	about   string // how the jobs are kept, for the first line
	connect func(ctx context.Context) (backend, error)
	lease   time.Duration
}

// backend is a connection of the demo's.
type backend interface {
	driver.Backend
	Close() error
}

func memoryWorld() world {
	broker := memory.NewBroker() // several "worker processes" share it
	return world{
		about:   "here, in memory",
		connect: func(context.Context) (backend, error) { return broker.Connect(), nil },
	}
}

// sqliteWorld keeps the jobs in the file path. A worker that dies leaves
// its job leased: the job comes back when the lease (one second) runs out.
func sqliteWorld(path string) world {
	return world{
		about: "here, in the SQLite file " + path,
		connect: func(ctx context.Context) (backend, error) {
			return sqlite.New(ctx, sqlite.Config{Path: path, IdleWait: 100 * time.Millisecond})
		},
		lease: time.Second,
	}
}

func demo(ctx context.Context, out io.Writer, verbose bool) error {
	return demoOn(ctx, out, verbose, memoryWorld(), false)
}

// demoOn runs the demo on w. With enqueueOnly it enqueues the jobs and
// returns; a later demoOn on the same jobs with enqueueOnly false finds
// and works them without enqueueing any.
func demoOn(ctx context.Context, out io.Writer, verbose bool, w world, enqueueOnly bool) error {
	pr := &printer{w: out}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	terminal := make(chan string, 16)
	// Each job's type is its short name in the output.
	name := func(j *ap.Job) string { return j.Type }

	cfg := func(worker int) ap.Config {
		return ap.Config{
			Lease:  w.lease,
			Queues: map[string]ap.QueueConfig{queue: {Concurrency: 1, Prefetch: ap.Limit(0)}},
			Policy: ap.Policy{
				RetryLimit:  ap.Limit(2),
				BackoffBase: 20 * time.Millisecond,
				BackoffCap:  80 * time.Millisecond,
			},
			RejectDelay: 30 * time.Millisecond,
			WorkerName:  fmt.Sprintf("worker-%d", worker),
			Logger:      logger,
			Middleware: []ap.Middleware{func(next ap.Handler) ap.Handler {
				return func(ctx context.Context, j *ap.Job) error {
					pr.f("  [worker-%d] %-8s try %d  (failures %d, crashes %d)", worker, name(j), j.TryCount, j.Failures, j.Crashes)
					return next(ctx, j)
				}
			}},
			Hooks: ap.Hooks{
				AfterAttempt: func(_ context.Context, a ap.Attempt) {
					switch a.Outcome {
					case ap.OutcomeSucceeded:
						pr.f("             %-8s ✔ succeeded", name(a.Job))
						terminal <- a.Job.ID
					case ap.OutcomeRetried:
						pr.f("             %-8s ✘ %v → retry in %v", name(a.Job), a.Err, time.Until(a.RetryAt).Round(time.Millisecond))
					case ap.OutcomeRejected:
						pr.f("             %-8s ↺ %v: requeued, no try spent", name(a.Job), a.Err)
					}
				},
				OnDeadLetter: func(_ context.Context, dl ap.DeadLetter) {
					pr.f("             %-8s ☠ dead-lettered: %s", name(&dl.Job), dl.Reason)
					terminal <- dl.Job.ID
				},
			},
		}
	}

	var mu sync.Mutex
	depDown := 2 // the "dependency" of the busy job is down for two tries
	handlers := map[string]ap.Handler{
		"greet": func(context.Context, *ap.Job) error { return nil },
		"flaky": func(_ context.Context, j *ap.Job) error {
			if j.TryCount < 3 {
				return errors.New("upstream timed out")
			}
			return nil
		},
		"doomed": func(context.Context, *ap.Job) error { return errors.New("disk full") },
		"parse": ap.JSON(func(_ context.Context, _ *ap.Job, v struct{ N int }) error {
			return nil
		}),
		"explode": func(context.Context, *ap.Job) error { panic("nil map write") },
		"busy": func(context.Context, *ap.Job) error {
			mu.Lock()
			defer mu.Unlock()
			if depDown > 0 {
				depDown--
				return ap.Reject(errors.New("payments API is down"))
			}
			return nil
		},
	}

	// A "process" is a connection to the broker plus a platform. The crash
	// job kills the process it runs in: its connection vanishes mid-job with
	// no outcome, and a supervisor starts a new process.
	crashed := make(chan int, 1)
	var conns []backend
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	startWorker := func(n int) (*ap.Platform, error) {
		conn, err := w.connect(ctx)
		if err != nil {
			return nil, err
		}
		conns = append(conns, conn)
		p, err := ap.New(conn, cfg(n))
		if err != nil {
			return nil, err
		}
		for t, h := range handlers {
			if err := p.Handle(t, h); err != nil {
				return nil, err
			}
		}
		err = p.Handle("crash", func(ctx context.Context, j *ap.Job) error {
			pr.f("             %-8s 💥 worker-%d dies mid-job (simulated OOM kill)", name(j), n)
			_ = conn.Close()
			crashed <- n
			<-ctx.Done()
			return ctx.Err()
		})
		if err != nil {
			return nil, err
		}
		return p, p.Start(ctx)
	}

	pconn, err := w.connect(ctx)
	if err != nil {
		return err
	}
	defer pconn.Close()
	producer, err := ap.New(pconn, ap.Config{Logger: logger})
	if err != nil {
		return err
	}
	jobs := []struct {
		name    string
		typ     string
		payload string
		about   string
	}{
		{"greet", "greet", `{}`, "succeeds"},
		{"flaky", "flaky", `{}`, "fails twice, then succeeds"},
		{"doomed", "doomed", `{}`, "always fails (retry limit 2)"},
		{"parse", "parse", `not json`, "has invalid input"},
		{"explode", "explode", `{}`, "panics"},
		{"busy", "busy", `{}`, "is rejected while a dependency is down"},
		{"crash", "crash", `{}`, "kills its worker process every time (poison limit 3)"},
	}
	remaining := len(jobs)
	if !enqueueOnly && w.lease > 0 { // a demo process that finds the jobs in the file
		st, err := pconn.Stats(ctx, queue)
		if err != nil {
			return err
		}
		remaining = int(st.Ready + st.Scheduled + st.InFlight)
		fmt.Fprintf(out, "Found %d jobs on queue %q, enqueued by the demo process before this one (this is pid %d).\n", remaining, queue, os.Getpid())
		if remaining == 0 {
			return errors.New("no jobs to work")
		}
	} else {
		fmt.Fprintf(out, "asyncplatform demo: the same failure semantics on every backend; %s.\n", w.about)
		fmt.Fprintln(out, "\nEnqueueing seven jobs on queue \"demo\":")
		for _, j := range jobs {
			job := &ap.Job{Type: j.typ, Queue: queue, Payload: []byte(j.payload)}
			if err := producer.Enqueue(ctx, job); err != nil {
				return err
			}
			fmt.Fprintf(out, "  %-8s %s\n", j.name, j.about)
		}
		if enqueueOnly {
			return nil
		}
	}
	fmt.Fprintln(out, "\nWorking (try = attempts so far, this one included):")

	worker := 1
	p, err := startWorker(worker)
	if err != nil {
		return err
	}
	live := []*ap.Platform{p}
	timeout := time.After(30 * time.Second)
	for remaining > 0 {
		select {
		case <-terminal:
			remaining--
		case n := <-crashed:
			pr.f("  [supervisor] worker-%d is gone; starting worker-%d", n, worker+1)
			worker++
			if p, err = startWorker(worker); err != nil {
				return err
			}
			live = append(live, p)
		case <-timeout:
			return errors.New("the jobs did not all finish within 30s")
		}
	}
	for _, p := range live {
		sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_ = p.Stop(sctx)
		cancel()
	}

	fmt.Fprintln(out, "\nDraining the dead-letter queue with NextDeadLetter:")
	for {
		err := producer.NextDeadLetter(ctx, queue, func(_ context.Context, dl ap.DeadLetter) (bool, error) {
			fmt.Fprintf(out, "  %-8s reason=%-16s tries=%d (failures %d, crashes %d) by %s\n",
				dl.Job.Type, dl.Reason, dl.Job.TryCount, dl.Job.Failures, dl.Job.Crashes, dl.Worker)
			fmt.Fprintf(out, "           last error: %s\n", firstLine(dl.Error))
			for _, e := range dl.Job.Errors {
				fmt.Fprintf(out, "           history:    %s\n", e)
			}
			return true, nil // pop: handled
		})
		if errors.Is(err, ap.ErrNoDeadLetters) {
			break
		}
		if err != nil {
			return err
		}
	}
	fmt.Fprintln(out, "\nThe dead-letter queue is empty. Run `go test ./...` to see the same contract proven on every backend.")
	return nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}
