package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/backend/sqlite"
	"github.com/asyncplatform/asyncplatform/outbox"
)

// A job enqueued in the same SQLite transaction as the caller's own
// write, then relayed to another backend (memory here; Redis, RabbitMQ,
// NATS or Azure in production), where a worker runs it.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox")
	defer os.RemoveAll(dir)
	src, err := sqlite.New(ctx, sqlite.Config{Path: filepath.Join(dir, "app.db")})
	if err != nil {
		panic(err)
	}
	defer src.Close()
	producer, _ := ap.New(src, ap.Config{Logger: slog.New(slog.DiscardHandler)})

	// The caller's write and the job commit together.
	tx, _ := src.DB().BeginTx(ctx, nil)
	_, _ = tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (id TEXT)`)
	_, _ = tx.ExecContext(ctx, `INSERT INTO orders VALUES ('o-1')`)
	job := &ap.Job{Type: "email", Queue: "mail", Payload: []byte("order o-1 confirmed")}
	if err := producer.Enqueue(sqlite.OutboxTx(ctx, tx), job); err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}

	// The relay moves it to the target backend, keeping its ID.
	dst, _ := memory.New(ctx, memory.Config{})
	defer dst.Close()
	relay, err := outbox.New(outbox.Config{Source: src, Target: dst})
	if err != nil {
		panic(err)
	}
	n, err := relay.Once(ctx) // Run(ctx) relays until ctx ends
	fmt.Println("relayed:", n, err)

	// A worker on the target runs it.
	worker, _ := ap.New(dst, ap.Config{Queues: map[string]ap.QueueConfig{"mail": {Concurrency: 1}}, Logger: slog.New(slog.DiscardHandler)})
	done := make(chan struct{})
	_ = worker.Handle("email", func(_ context.Context, j *ap.Job) error {
		fmt.Println(string(j.Payload), "same ID:", j.ID == job.ID)
		close(done)
		return nil
	})
	_ = worker.Start(ctx)
	<-done
	_ = worker.Stop(ctx)
	// Output:
	// relayed: 1 <nil>
	// order o-1 confirmed same ID: true
}
