package asyncplatform_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"sync/atomic"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// Redrive moves dead letters back to their queue once the cause is fixed: the
// job runs again with its counters reset to zero and its error history kept.
func ExamplePlatform_Redrive() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	dead := make(chan ap.DeadLetter, 1)
	p, err := ap.New(backend, ap.Config{
		Logger: slog.New(slog.DiscardHandler),
		Hooks:  ap.Hooks{OnDeadLetter: func(_ context.Context, dl ap.DeadLetter) { dead <- dl }},
	})
	if err != nil {
		log.Fatal(err)
	}

	var ratesLoaded atomic.Bool // the bug, fixed by an operator below
	converted := make(chan string, 1)
	_ = p.Handle("invoice.convert", func(ctx context.Context, job *ap.Job) error {
		if !ratesLoaded.Load() {
			return ap.Permanent(errors.New("no exchange rate for XTS"))
		}
		converted <- fmt.Sprintf("converted on try %d (failures %d); error history kept: %d line",
			job.TryCount, job.Failures, len(job.Errors))
		return nil
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)

	if err := p.Enqueue(ctx, &ap.Job{ID: "inv-7", Type: "invoice.convert"}); err != nil {
		log.Fatal(err)
	}
	dl := <-dead
	fmt.Printf("%s dead: %s after %d try\n", dl.Job.ID, dl.Reason, dl.Job.TryCount)

	ratesLoaded.Store(true)
	n, err := p.Redrive(ctx, ap.DefaultQueue, "inv-7") // no IDs: every dead letter of the queue
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("redriven:", n)
	fmt.Println(<-converted)

	st, err := p.Stats(ctx, ap.DefaultQueue)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("dead letters left:", st.Dead)
	// Output:
	// inv-7 dead: permanent after 1 try
	// redriven: 1
	// converted on try 1 (failures 0); error history kept: 1 line
	// dead letters left: 0
}

// RedriveWith redrives a large dead-letter queue in chunks, reporting its
// progress after each one; the queue is listed once for all of them.
func ExamplePlatform_RedriveWith() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	var dead atomic.Int32
	p, err := ap.New(backend, ap.Config{
		Logger: slog.New(slog.DiscardHandler),
		Hooks:  ap.Hooks{OnDeadLetter: func(context.Context, ap.DeadLetter) { dead.Add(1) }},
	})
	if err != nil {
		log.Fatal(err)
	}
	var fixed atomic.Bool
	_ = p.Handle("report", func(context.Context, *ap.Job) error {
		if !fixed.Load() {
			return ap.Permanent(errors.New("the template is missing"))
		}
		return nil
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	for i := range 5 {
		_ = p.Enqueue(ctx, &ap.Job{ID: fmt.Sprintf("r%d", i), Type: "report"})
	}
	for dead.Load() < 5 {
		time.Sleep(time.Millisecond)
	}

	fixed.Store(true)
	n, err := p.RedriveWith(ctx, ap.DefaultQueue, ap.RedriveOptions{
		Chunk:    2,
		Progress: func(done int) error { fmt.Println("redriven so far:", done); return nil },
	})
	fmt.Println("redriven:", n, err)
	// Output:
	// redriven so far: 2
	// redriven so far: 4
	// redriven so far: 5
	// redriven: 5 <nil>
}
