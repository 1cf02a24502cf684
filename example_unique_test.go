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

// A unique job holds its key while it is live: another Enqueue with the
// same key stores nothing and returns an error matching ErrDuplicate that
// names the holder. The key is free again once the job succeeded (or was
// dead-lettered), or when its window ends. Unique keys live in the
// backend's store (the memory backend keeps one; RabbitMQ takes a
// companion, see rabbit.Config.Store).
func Example_uniqueJobs() {
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
	done := make(chan string, 1)
	_ = p.Handle("invoice.send", func(ctx context.Context, job *ap.Job) error {
		done <- job.ID
		return nil
	})

	invoice := func(id string) *ap.Job {
		return &ap.Job{ID: id, Type: "invoice.send", UniqueKey: "invoice/order-42", UniqueWindow: time.Hour}
	}
	if err := p.Enqueue(ctx, invoice("first")); err != nil {
		log.Fatal(err)
	}
	err = p.Enqueue(ctx, invoice("second")) // a retried request, say
	var ue *ap.UniqueError
	if errors.Is(err, ap.ErrDuplicate) && errors.As(err, &ue) {
		fmt.Printf("second refused: key %s held by %s\n", ue.Key, ue.Holder)
	}

	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	fmt.Println("sent:", <-done)
	// The key is released just after the job's success is recorded.
	for err = p.Enqueue(ctx, invoice("third")); errors.Is(err, ap.ErrDuplicate); err = p.Enqueue(ctx, invoice("third")) {
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("sent:", <-done)
	// Output:
	// second refused: key invoice/order-42 held by first
	// sent: first
	// sent: third
}
