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

// Platform.Cancel ends a job from any process: a running handler's context
// ends with ErrJobCancelled, and the job is dead-lettered as cancelled,
// never retried.
func ExamplePlatform_Cancel() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	dead := make(chan ap.DeadLetter, 1)
	p, err := ap.New(backend, ap.Config{
		TrackStatus: true,
		Hooks:       ap.Hooks{OnDeadLetter: func(_ context.Context, dl ap.DeadLetter) { dead <- dl }},
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	started := make(chan struct{})
	_ = p.Handle("export", func(ctx context.Context, job *ap.Job) error {
		close(started)
		<-ctx.Done() // a long export, watching its context
		fmt.Println("handler:", context.Cause(ctx), errors.Is(ctx.Err(), ap.ErrJobCancelled))
		return ctx.Err()
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)

	job := &ap.Job{Type: "export"}
	if err := p.Enqueue(ctx, job); err != nil {
		log.Fatal(err)
	}
	<-started
	if err := p.Cancel(ctx, job.ID); err != nil {
		log.Fatal(err)
	}
	dl := <-dead
	fmt.Println("dead-lettered:", dl.Reason, "failures:", dl.Job.Failures)
	// The job's end is written after the dead-letter hook runs: until it
	// is, Status may already say cancelled (from the cancel mark) while a
	// second Cancel still succeeds (cancelling twice is not an error).
	finished := errors.Is(p.Cancel(ctx, job.ID), ap.ErrJobFinished)
	for deadline := time.Now().Add(10 * time.Second); !finished && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		finished = errors.Is(p.Cancel(ctx, job.ID), ap.ErrJobFinished)
	}
	st, _ := p.Status(ctx, job.ID)
	fmt.Println("status:", st.State)
	fmt.Println("cancel again:", finished)
	// Output:
	// handler: asyncplatform: job cancelled (Platform.Cancel) true
	// dead-lettered: cancelled failures: 0
	// status: cancelled
	// cancel again: true
}
