package nats_test

import (
	"context"
	"log"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/nats"
)

// Example builds a NATS JetStream backend, which dials the server and makes
// its streams, and hands it to asyncplatform.New.
func Example() {
	ctx := context.Background()
	backend, err := nats.New(ctx, nats.Config{URL: "nats://127.0.0.1:4222", Stream: "SHOP"})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()

	p, err := ap.New(backend, ap.Config{})
	if err != nil {
		log.Fatal(err)
	}
	_ = p.Handle("email.send", func(ctx context.Context, job *ap.Job) error {
		log.Printf("sending %s", job.Payload)
		return nil
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	if err := p.Enqueue(ctx, &ap.Job{Type: "email.send", Payload: []byte("welcome mail")}); err != nil {
		log.Fatal(err)
	}
}
