package asyncplatform_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// A Policy can be given at four levels; for each setting the most specific
// level that sets it wins: the job (Job.Policy), then the job type
// (Platform.Handle), then the queue (Config.Queues), then the platform
// (Config.Policy), then the defaults. Here every job always fails, and the
// retry limit that applies decides how often it runs (limit + 1 times).
func ExamplePolicy() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	dead := make(chan ap.DeadLetter)
	p, err := ap.New(backend, ap.Config{
		Logger: slog.New(slog.DiscardHandler),
		Policy: ap.Policy{RetryLimit: ap.Limit(5), BackoffBase: time.Millisecond, BackoffCap: 2 * time.Millisecond},
		Queues: map[string]ap.QueueConfig{
			"default": {Concurrency: 1},
			"reports": {Concurrency: 1, Policy: ap.Policy{RetryLimit: ap.Limit(2)}},
		},
		Hooks: ap.Hooks{OnDeadLetter: func(_ context.Context, dl ap.DeadLetter) { dead <- dl }},
	})
	if err != nil {
		log.Fatal(err)
	}
	fail := func(ctx context.Context, job *ap.Job) error { return errors.New("upstream said no") }
	_ = p.Handle("report.daily", fail)                                      // no policy of its own
	_ = p.Handle("report.export", fail, ap.Policy{RetryLimit: ap.Limit(0)}) // never retried
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)

	run := func(job *ap.Job, why string) {
		if err := p.Enqueue(ctx, job); err != nil {
			log.Fatal(err)
		}
		dl := <-dead
		fmt.Printf("%s on %s: %d tries, then %s (%s)\n", dl.Job.Type, dl.Queue, dl.Job.TryCount, dl.Reason, why)
	}
	run(&ap.Job{Type: "report.daily"}, "the platform's limit, 5")
	run(&ap.Job{Type: "report.daily", Queue: "reports"}, "the queue's limit, 2")
	run(&ap.Job{Type: "report.export", Queue: "reports"}, "the type's limit, 0")
	run(&ap.Job{Type: "report.export", Queue: "reports", Policy: ap.Policy{RetryLimit: ap.Limit(1)}}, "the job's limit, 1")
	// Output:
	// report.daily on default: 6 tries, then retries_exceeded (the platform's limit, 5)
	// report.daily on reports: 3 tries, then retries_exceeded (the queue's limit, 2)
	// report.export on reports: 1 tries, then retries_exceeded (the type's limit, 0)
	// report.export on reports: 2 tries, then retries_exceeded (the job's limit, 1)
}

// Handle registers a handler per job type, with its own failure policy. Here a
// flaky job fails twice and succeeds on its third try.
func ExamplePlatform_Handle() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	p, err := ap.New(backend, ap.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}

	done := make(chan struct{})
	_ = p.Handle("report.build", func(ctx context.Context, job *ap.Job) error {
		fmt.Printf("try %d (failures so far %d)\n", job.TryCount, job.Failures)
		if job.TryCount < 3 {
			return errors.New("warehouse timed out")
		}
		close(done)
		return nil
	}, ap.Policy{RetryLimit: ap.Limit(5), BackoffBase: time.Millisecond, BackoffCap: 5 * time.Millisecond})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)

	if err := p.Enqueue(ctx, &ap.Job{Type: "report.build"}); err != nil {
		log.Fatal(err)
	}
	<-done
	// Output:
	// try 1 (failures so far 0)
	// try 2 (failures so far 1)
	// try 3 (failures so far 2)
}
