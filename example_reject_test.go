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

// Reject hands a job back because something it needs is down: the job is
// requeued after Config.RejectDelay as often as it takes, and no try is spent.
// TryCount and Failures stay as they were; only the copy number moves on.
func ExampleReject() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	p, err := ap.New(backend, ap.Config{
		Logger:      slog.New(slog.DiscardHandler),
		RejectDelay: 5 * time.Millisecond,               // defaults to DefaultRejectDelay
		Policy:      ap.Policy{RetryLimit: ap.Limit(0)}, // even with no retry at all
	})
	if err != nil {
		log.Fatal(err)
	}

	var pings atomic.Int32 // the database answers from the third ping on
	databaseUp := func() bool { return pings.Add(1) >= 3 }
	done := make(chan struct{})
	_ = p.Handle("order.ship", func(ctx context.Context, job *ap.Job) error {
		fmt.Printf("copy %d: try %d, failures %d: ", job.CopyNumber(), job.TryCount, job.Failures)
		if !databaseUp() {
			fmt.Println("rejected")
			return ap.Reject(errors.New("database unreachable"))
		}
		fmt.Println("shipped")
		close(done)
		return nil
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)

	if err := p.Enqueue(ctx, &ap.Job{Type: "order.ship"}); err != nil {
		log.Fatal(err)
	}
	<-done
	// Output:
	// copy 0: try 1, failures 0: rejected
	// copy 1: try 1, failures 0: rejected
	// copy 2: try 1, failures 0: shipped
}

// RejectAfter is Reject with its own delay, when the handler knows better
// than Config.RejectDelay (a rate limit's Retry-After, say).
func ExampleRejectAfter() {
	ctx := context.Background()
	backend, err := memory.New(ctx, memory.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	p, err := ap.New(backend, ap.Config{
		Logger:      slog.New(slog.DiscardHandler),
		RejectDelay: time.Hour, // RejectAfter's delay wins
	})
	if err != nil {
		log.Fatal(err)
	}

	const retryAfter = 20 * time.Millisecond
	var rejectedAt time.Time
	done := make(chan struct{})
	_ = p.Handle("sms.send", func(ctx context.Context, job *ap.Job) error {
		if job.CopyNumber() == 0 {
			fmt.Printf("try %d, failures %d: rate limited\n", job.TryCount, job.Failures)
			rejectedAt = time.Now()
			return ap.RejectAfter(errors.New("429 Too Many Requests"), retryAfter)
		}
		fmt.Printf("try %d, failures %d: sent, after waiting at least %v: %v\n",
			job.TryCount, job.Failures, retryAfter, time.Since(rejectedAt) >= retryAfter)
		close(done)
		return nil
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)

	if err := p.Enqueue(ctx, &ap.Job{Type: "sms.send"}); err != nil {
		log.Fatal(err)
	}
	<-done
	// Output:
	// try 1, failures 0: rate limited
	// try 1, failures 0: sent, after waiting at least 20ms: true
}
