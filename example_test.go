package asyncplatform_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// Enqueue stores a job; a worker (here the same platform) runs its handler.
func ExamplePlatform_Enqueue() {
	ctx := context.Background()
	backend := memory.NewBroker().Connect()
	defer backend.Close()
	p, _ := ap.New(backend, ap.Config{Logger: quiet})

	done := make(chan struct{})
	_ = p.Handle("email.send", func(ctx context.Context, job *ap.Job) error {
		fmt.Printf("sending %s (try %d)\n", job.Payload, job.TryCount)
		close(done)
		return nil
	})
	_ = p.Start(ctx)
	defer p.Stop(ctx)

	job := &ap.Job{Type: "email.send", Payload: []byte("welcome mail to ada@example.com")}
	if err := p.Enqueue(ctx, job); err != nil {
		fmt.Println("enqueue:", err)
	}
	<-done
	// Output: sending welcome mail to ada@example.com (try 1)
}

// Handle registers a handler per job type, with its own failure policy. Here a
// flaky job fails twice and succeeds on its third try.
func ExamplePlatform_Handle() {
	ctx := context.Background()
	backend := memory.NewBroker().Connect()
	defer backend.Close()
	p, _ := ap.New(backend, ap.Config{Logger: quiet})

	done := make(chan struct{})
	_ = p.Handle("report.build", func(ctx context.Context, job *ap.Job) error {
		fmt.Printf("try %d (failures so far %d)\n", job.TryCount, job.Failures)
		if job.TryCount < 3 {
			return errors.New("warehouse timed out")
		}
		close(done)
		return nil
	}, ap.Policy{RetryLimit: ap.Limit(5), BackoffBase: time.Millisecond, BackoffCap: 5 * time.Millisecond})
	_ = p.Start(ctx)
	defer p.Stop(ctx)

	_ = p.Enqueue(ctx, &ap.Job{Type: "report.build"})
	<-done
	// Output:
	// try 1 (failures so far 0)
	// try 2 (failures so far 1)
	// try 3 (failures so far 2)
}

// NextDeadLetter drains dead letters one at a time: pop what was handled, keep
// the rest.
func ExamplePlatform_NextDeadLetter() {
	ctx := context.Background()
	backend := memory.NewBroker().Connect()
	defer backend.Close()
	dead := make(chan struct{})
	p, _ := ap.New(backend, ap.Config{
		Logger: quiet,
		Hooks:  ap.Hooks{OnDeadLetter: func(context.Context, ap.DeadLetter) { close(dead) }},
	})
	_ = p.Handle("invoice.parse", func(ctx context.Context, job *ap.Job) error {
		return ap.Invalid(errors.New("not a PDF"))
	})
	_ = p.Start(ctx)
	_ = p.Enqueue(ctx, &ap.Job{ID: "inv-42", Type: "invoice.parse", Payload: []byte("%GIF89a")})
	<-dead
	_ = p.Stop(ctx)

	for {
		err := p.NextDeadLetter(ctx, ap.DefaultQueue, func(ctx context.Context, dl ap.DeadLetter) (bool, error) {
			fmt.Printf("%s %s: %s after %d try: %s\n", dl.Job.ID, dl.Job.Type, dl.Reason, dl.Job.TryCount, dl.Error)
			return true, nil // pop it
		})
		if errors.Is(err, ap.ErrNoDeadLetters) {
			fmt.Println("no more dead letters")
			return
		}
	}
	// Output:
	// inv-42 invoice.parse: invalid after 1 try: invalid input: not a PDF
	// no more dead letters
}

// JSON decodes a job's payload into a typed value for the handler; a payload
// that does not decode is dead-lettered as invalid, never retried.
func ExampleJSON() {
	type Signup struct {
		Email string `json:"email"`
	}
	ctx := context.Background()
	backend := memory.NewBroker().Connect()
	defer backend.Close()
	p, _ := ap.New(backend, ap.Config{Logger: quiet})
	done := make(chan struct{})
	_ = p.Handle("signup", ap.JSON(func(ctx context.Context, job *ap.Job, s Signup) error {
		fmt.Println("welcome,", s.Email)
		close(done)
		return nil
	}))
	_ = p.Start(ctx)
	defer p.Stop(ctx)
	job, _ := ap.NewJSONJob("signup", Signup{Email: "grace@example.com"})
	_ = p.Enqueue(ctx, job)
	<-done
	// Output: welcome, grace@example.com
}
