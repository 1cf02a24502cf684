package asyncplatform_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// Enqueue stores a job durably and fills in what was left empty (ID, Queue,
// EnqueuedAt). A platform need not be started to enqueue; a worker (here the
// same platform, once started) runs the job's handler.
func ExamplePlatform_Enqueue() {
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
	_ = p.Handle("email.send", func(ctx context.Context, job *ap.Job) error {
		fmt.Printf("sending %s (try %d)\n", job.Payload, job.TryCount)
		close(done)
		return nil
	})

	job := &ap.Job{Type: "email.send", Payload: []byte("welcome mail to ada@example.com")}
	if err := p.Enqueue(ctx, job); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("enqueued on queue %q, ID set: %v\n", job.Queue, job.ID != "")

	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	<-done
	// Output:
	// enqueued on queue "default", ID set: true
	// sending welcome mail to ada@example.com (try 1)
}
