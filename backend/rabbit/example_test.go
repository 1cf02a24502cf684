package rabbit_test

import (
	"context"
	"log"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/rabbit"
)

// Example builds a RabbitMQ backend, which connects to the broker (and
// redials it in the background when the connection is lost), and hands it
// to asyncplatform.New.
func Example() {
	ctx := context.Background()
	backend, err := rabbit.New(ctx, rabbit.Config{URL: "amqp://guest:guest@127.0.0.1:5672/", Prefix: "shop"})
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
