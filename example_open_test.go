package asyncplatform_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"

	ap "github.com/asyncplatform/asyncplatform"
	_ "github.com/asyncplatform/asyncplatform/backend/memory" // registers memory:// for Open
)

// Open opens a backend from a URL, so the broker can be chosen by
// configuration: each backend package registers its scheme when imported
// (memory://, redis://, amqp://, nats://, azure:). The caller owns the backend
// and closes it, after the platform's Stop.
func ExampleOpen() {
	ctx := context.Background()
	backend, err := ap.Open(ctx, "memory://example-open")
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()

	p, err := ap.New(backend, ap.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan struct{})
	_ = p.Handle("ping", func(ctx context.Context, job *ap.Job) error {
		fmt.Printf("%s over a backend opened by URL\n", job.Payload)
		close(done)
		return nil
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	if err := p.Enqueue(ctx, &ap.Job{Type: "ping", Payload: []byte("pong")}); err != nil {
		log.Fatal(err)
	}
	<-done

	// A scheme whose backend package is not imported is refused.
	_, err = ap.Open(ctx, "kafka://localhost:9092")
	fmt.Println("kafka:// unknown:", errors.Is(err, ap.ErrUnknownScheme))
	// Output:
	// pong over a backend opened by URL
	// kafka:// unknown: true
}
