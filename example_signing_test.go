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

// With a SigningKey, every job is signed for the queue it is written to:
// its bytes copied onto another queue are dead-lettered there as a bad
// signature. ReplayWindow (off by default) also refuses a signed job due
// longer ago than the window, which bounds how late a copied message can
// be replayed; RequireBoundSignatures refuses jobs signed by versions
// before queue binding, once they have drained.
func Example_signing() {
	ctx := context.Background()
	broker := memory.NewBroker()
	key := []byte("a 32-byte key from your secrets!") // use 32 random bytes
	p, err := ap.New(broker.Connect(), ap.Config{
		SigningKey:             key,
		ReplayWindow:           24 * time.Hour,
		RequireBoundSignatures: true,
		Logger:                 slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan struct{})
	_ = p.Handle("invoice.send", func(ctx context.Context, job *ap.Job) error {
		fmt.Printf("sent %s from queue %s\n", job.Payload, job.Queue)
		close(done)
		return nil
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	if err := p.Enqueue(ctx, &ap.Job{Type: "invoice.send", Payload: []byte("invoice 42")}); err != nil {
		log.Fatal(err)
	}
	<-done
	// Output: sent invoice 42 from queue default
}
