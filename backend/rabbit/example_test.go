package rabbit_test

import (
	"context"
	"errors"
	"log"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/rabbit"
	"github.com/asyncplatform/asyncplatform/pgstore"
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

// Example_deadLettersInStore gives the backend a companion store, where
// its dead letters then live: a peek, a pop, a page and a look-up by ID
// cost the same at any depth, and the records of the dead-letter queue
// move into the store on the first dead-letter call.
func Example_deadLettersInStore() {
	ctx := context.Background()
	// A pool as large as the dead-letter calls' concurrency (32).
	store, err := pgstore.New(ctx, pgstore.Config{URL: "postgres://postgres@127.0.0.1:5432/test?pool_max_conns=32"})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	backend, err := rabbit.New(ctx, rabbit.Config{
		URL:      "amqp://guest:guest@127.0.0.1:5672/",
		Prefix:   "shop",
		Store:    store,
		DeadHold: time.Minute, // a vanished admin's record is hidden for at most a minute
	})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	p, err := ap.New(backend, ap.Config{})
	if err != nil {
		log.Fatal(err)
	}
	err = p.NextDeadLetter(ctx, ap.DefaultQueue, func(ctx context.Context, dl ap.DeadLetter) (bool, error) {
		log.Printf("dead letter %s: %s", dl.Job.ID, dl.Error)
		return true, nil // pop it
	})
	if err != nil && !errors.Is(err, ap.ErrNoDeadLetters) {
		log.Fatal(err)
	}
}
