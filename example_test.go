package asyncplatform_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/sqlite"
)

// The quick start: a backend (a SQLite file, whose jobs survive a restart),
// a platform working one queue, a handler for a job type, Start, Enqueue,
// and a graceful Stop. The other examples, one file
// per feature (example_<feature>_test.go), build on this.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// A SQLite file: durable on one machine, no server. Or memory.New,
	// postgres.New, redis.New, rabbit.New, nats.New, azure.New.
	backend, err := sqlite.New(ctx, sqlite.Config{Path: filepath.Join(dir, "jobs.db")})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close() // after Stop: the platform does not close it

	p, err := ap.New(backend, ap.Config{
		Logger: slog.New(slog.DiscardHandler),
		Queues: map[string]ap.QueueConfig{
			"emails": {Concurrency: 20, Policy: ap.Policy{RetryLimit: ap.Limit(5)}},
		},
	})
	if err != nil {
		log.Fatal(err)
	}

	done := make(chan struct{})
	err = p.Handle("email.send", func(ctx context.Context, job *ap.Job) error {
		fmt.Printf("sending %s (try %d)\n", job.Payload, job.TryCount)
		close(done)
		return nil
	}, ap.Policy{Timeout: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx) // graceful: running jobs finish or are handed back, uncounted

	err = p.Enqueue(ctx, &ap.Job{Type: "email.send", Queue: "emails", Payload: []byte("welcome mail to ada@example.com")})
	if err != nil {
		log.Fatal(err)
	}
	<-done
	// Output: sending welcome mail to ada@example.com (try 1)
}
