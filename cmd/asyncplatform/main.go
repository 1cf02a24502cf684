// Command asyncplatform runs a demonstration of asyncplatform's failure
// handling on the embedded in-memory backend.
//
//	go run ./cmd/asyncplatform demo
//
// It enqueues a mix of jobs (one succeeds, one fails twice then succeeds, one
// always fails, one has invalid input, one panics, one is rejected while a
// dependency is "down", one crashes its worker process every time), shows
// every attempt with its try count, then drains the dead-letter queue with
// NextDeadLetter and prints each record.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

func main() {
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: asyncplatform demo [-v]\n\n"+
			"demo  runs a tour of the failure handling on the in-memory backend\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 || flag.Arg(0) != "demo" {
		flag.Usage()
		os.Exit(2)
	}
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	verbose := fs.Bool("v", false, "also print the platform's own debug log")
	_ = fs.Parse(flag.Args()[1:])
	if err := demo(context.Background(), os.Stdout, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
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

func demo(ctx context.Context, out io.Writer, verbose bool) error {
	pr := &printer{w: out}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	broker := memory.NewBroker() // several "worker processes" share it
	terminal := make(chan string, 16)
	names := map[string]string{} // job ID → short name, for the output
	name := func(j *ap.Job) string { return names[j.ID] }

	cfg := func(worker int) ap.Config {
		return ap.Config{
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
	startWorker := func(n int) (*ap.Platform, error) {
		conn := broker.Connect()
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

	producer, err := ap.New(broker.Connect(), ap.Config{Logger: logger})
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
	fmt.Fprintln(out, "asyncplatform demo: the same failure semantics on every backend; here, in memory.")
	fmt.Fprintln(out, "\nEnqueueing seven jobs on queue \"demo\":")
	for _, j := range jobs {
		job := &ap.Job{Type: j.typ, Queue: queue, Payload: []byte(j.payload)}
		if err := producer.Enqueue(ctx, job); err != nil {
			return err
		}
		names[job.ID] = j.name
		fmt.Fprintf(out, "  %-8s %s\n", j.name, j.about)
	}
	fmt.Fprintln(out, "\nWorking (try = attempts so far, this one included):")

	worker := 1
	p, err := startWorker(worker)
	if err != nil {
		return err
	}
	live := []*ap.Platform{p}
	remaining := len(jobs)
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
				names[dl.Job.ID], dl.Reason, dl.Job.TryCount, dl.Job.Failures, dl.Job.Crashes, dl.Worker)
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
