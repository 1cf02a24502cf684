package asyncplatform_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// Stop is graceful: it takes no new jobs and waits for the running handlers
// to finish, as long as its context allows.
func ExamplePlatform_Stop() {
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

	started, stopping := make(chan struct{}), make(chan struct{})
	_ = p.Handle("report.build", func(ctx context.Context, job *ap.Job) error {
		close(started)
		<-stopping
		time.Sleep(10 * time.Millisecond) // the rest of the work
		fmt.Println("handler: report written, context error:", ctx.Err())
		return nil
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	if err := p.Enqueue(ctx, &ap.Job{Type: "report.build"}); err != nil {
		log.Fatal(err)
	}
	<-started

	fmt.Println("stopping")
	close(stopping)
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second) // how long running handlers may take
	defer cancel()
	fmt.Println("Stop returned:", p.Stop(stopCtx))
	// Output:
	// stopping
	// handler: report written, context error: <nil>
	// Stop returned: <nil>
}

// When Stop's context ends first, the handlers still running are cancelled
// and their jobs handed back to the queue uncounted: no try is spent, and the
// next worker (here a second platform on the same backend) runs the job as if
// for the first time.
func ExamplePlatform_Stop_handBack() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	cfg := ap.Config{Logger: slog.New(slog.DiscardHandler)}

	p1, err := ap.New(backend, cfg)
	if err != nil {
		log.Fatal(err)
	}
	started, cancelled := make(chan struct{}), make(chan error, 1)
	_ = p1.Handle("video.encode", func(ctx context.Context, job *ap.Job) error {
		close(started)
		<-ctx.Done() // a long job that honours its context
		cancelled <- ctx.Err()
		return ctx.Err()
	})
	if err := p1.Start(ctx); err != nil {
		log.Fatal(err)
	}
	if err := p1.Enqueue(ctx, &ap.Job{Type: "video.encode"}); err != nil {
		log.Fatal(err)
	}
	<-started

	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	fmt.Println("Stop returned:", p1.Stop(stopCtx))
	fmt.Println("the handler's context:", <-cancelled)

	p2, err := ap.New(backend, cfg)
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan struct{})
	_ = p2.Handle("video.encode", func(ctx context.Context, job *ap.Job) error {
		fmt.Printf("next worker: try %d, failures %d, crashes %d (copy %d)\n",
			job.TryCount, job.Failures, job.Crashes, job.CopyNumber())
		close(done)
		return nil
	})
	if err := p2.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p2.Stop(ctx)
	<-done
	// Output:
	// Stop returned: context deadline exceeded
	// the handler's context: context canceled
	// next worker: try 1, failures 0, crashes 0 (copy 1)
}
