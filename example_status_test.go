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

// Platform.Status looks a job up by its ID, from any process, when its
// queue tracks status: here a job that fails twice, then succeeds.
func ExamplePlatform_Status() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	var p *ap.Platform
	ended := make(chan struct{}) // the last attempt's hook has printed
	p, err = ap.New(backend, ap.Config{
		// One worker, so that each attempt's hook runs before the next
		// attempt starts (a status shows the latest attempt).
		Queues: map[string]ap.QueueConfig{"reports": {TrackStatus: true, Concurrency: 1}},
		Policy: ap.Policy{BackoffBase: time.Millisecond},
		Hooks: ap.Hooks{AfterAttempt: func(ctx context.Context, a ap.Attempt) {
			st, _ := p.Status(ctx, a.Job.ID) // written before the hook runs
			fmt.Printf("after try %d: %s\n", a.Job.TryCount, st.State)
			if st.State.Terminal() {
				close(ended)
			}
		}},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = p.Handle("render", func(ctx context.Context, job *ap.Job) error {
		st, _ := p.Status(ctx, job.ID)
		fmt.Printf("try %d: %s\n", job.TryCount, st.State)
		if job.TryCount < 3 {
			return errors.New("the renderer is warming up")
		}
		job.SetResult([]byte("report.pdf"))
		return nil
	})

	job := &ap.Job{Type: "render", Queue: "reports"}
	if err := p.Enqueue(ctx, job); err != nil {
		log.Fatal(err)
	}
	st, _ := p.Status(ctx, job.ID)
	fmt.Println("enqueued:", st.State)
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
	}
	st, _ = p.Status(ctx, job.ID)
	fmt.Printf("%s after %d tries (%d failures, the last %q): %s\n", st.State, st.Tries, st.Failures, st.Error, st.Result)
	// Output:
	// enqueued: waiting
	// try 1: running
	// after try 1: retrying
	// try 2: running
	// after try 2: retrying
	// try 3: running
	// after try 3: succeeded
	// succeeded after 3 tries (2 failures, the last "the renderer is warming up"): report.pdf
}
