package postgres_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strconv"
	"strings"

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

// exampleDB connects to the machine's PostgreSQL (the tests' database)
// and returns a pool and a prefix of the example's own, whose tables and
// the orders table it drops when done.
func exampleDB(ctx context.Context) (pool *pgxpool.Pool, prefix string, done func()) {
	url := os.Getenv(postgres.URLEnv)
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	prefix = "ex_" + strings.ToLower(rand.Text()[:10])
	if _, err := pool.Exec(ctx, `CREATE TABLE `+prefix+`_orders (id int PRIMARY KEY, shipped bool NOT NULL DEFAULT false)`); err != nil {
		log.Fatal(err)
	}
	return pool, prefix, func() {
		pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+prefix+`_orders, `+prefix+`_jobs, `+prefix+`_dead, `+prefix+`_queues, `+prefix+`_migrations, `+prefix+`_store;
			DROP SEQUENCE IF EXISTS `+prefix+`_token, `+prefix+`_store_rev`)
		pool.Close()
	}
}

// ExampleWithTx enqueues a job in the transaction that writes the order:
// the job exists if and only if the order commits.
func ExampleWithTx() {
	ctx := context.Background()
	pool, prefix, done := exampleDB(ctx)
	defer done()
	backend, err := postgres.New(ctx, postgres.Config{Pool: pool, Prefix: prefix})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	p, err := ap.New(backend, ap.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	order := func(id int, commit bool) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO `+prefix+`_orders (id) VALUES ($1)`, id); err != nil {
			return err
		}
		if err := p.Enqueue(postgres.WithTx(ctx, tx), &ap.Job{Type: "order.confirm", Payload: []byte(strconv.Itoa(id))}); err != nil {
			return err
		}
		if !commit {
			return tx.Rollback(ctx) // the order and its job vanish together
		}
		return tx.Commit(ctx)
	}
	if err := order(41, false); err != nil {
		log.Fatal(err)
	}
	if err := order(42, true); err != nil {
		log.Fatal(err)
	}

	confirmed := make(chan string)
	_ = p.Handle("order.confirm", func(ctx context.Context, job *ap.Job) error {
		confirmed <- string(job.Payload)
		return nil
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	fmt.Println("confirmed order", <-confirmed)
	// Output:
	// confirmed order 42
}

// ExampleBackend_CompleteTx ships an order and completes its job in one
// transaction: the order is marked shipped if and only if the job is
// done.
func ExampleBackend_CompleteTx() {
	ctx := context.Background()
	pool, prefix, done := exampleDB(ctx)
	defer done()
	backend, err := postgres.New(ctx, postgres.Config{Pool: pool, Prefix: prefix})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	shipped := make(chan ap.Outcome, 1)
	p, err := ap.New(backend, ap.Config{
		Logger: slog.New(slog.DiscardHandler),
		Hooks: ap.Hooks{AfterAttempt: func(_ context.Context, a ap.Attempt) {
			shipped <- a.Outcome
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+prefix+`_orders (id) VALUES (42)`); err != nil {
		log.Fatal(err)
	}
	_ = p.Handle("order.ship", func(ctx context.Context, job *ap.Job) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `UPDATE `+prefix+`_orders SET shipped = true WHERE id = $1`, string(job.Payload)); err != nil {
				return err
			}
			return backend.CompleteTx(ctx, tx) // the job is done when tx commits
		})
	})
	if err := p.Enqueue(ctx, &ap.Job{Type: "order.ship", Payload: []byte("42")}); err != nil {
		log.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	fmt.Println("outcome:", <-shipped)
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT shipped FROM `+prefix+`_orders WHERE id = 42`).Scan(&ok); err != nil {
		log.Fatal(err)
	}
	fmt.Println("shipped:", ok)
	// Output:
	// outcome: succeeded
	// shipped: true
}
