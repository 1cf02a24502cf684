package postgres_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/postgres"
)

// Example builds a PostgreSQL backend over a pgx pool and hands it to
// asyncplatform.New. The backend never closes the pool.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	backend, err := postgres.New(ctx, postgres.Config{Pool: pool, Prefix: "shop"})
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

// ExampleWithTx enqueues a job in the transaction that writes the order:
// the job exists if and only if the order commits.
func ExampleWithTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	backend, err := postgres.New(ctx, postgres.Config{Pool: pool, Prefix: "shop"})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	p, err := ap.New(backend, ap.Config{})
	if err != nil {
		log.Fatal(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, 42); err != nil {
			return err
		}
		return p.Enqueue(postgres.WithTx(ctx, tx), &ap.Job{Type: "order.confirm", Payload: []byte("42")})
	})
	if err != nil {
		log.Fatal(err)
	}
}
