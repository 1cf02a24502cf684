package sqlite_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/sqlite"
)

// Example builds a SQLite backend on a database file and hands it to
// asyncplatform.New: the jobs survive a restart of the process.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "jobs")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	backend, err := sqlite.New(ctx, sqlite.Config{Path: filepath.Join(dir, "jobs.db")})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()

	p, err := ap.New(backend, ap.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	sent := make(chan string)
	_ = p.Handle("email.send", func(ctx context.Context, job *ap.Job) error {
		sent <- string(job.Payload)
		return nil
	})
	if err := p.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer p.Stop(ctx)
	if err := p.Enqueue(ctx, &ap.Job{Type: "email.send", Payload: []byte("welcome mail")}); err != nil {
		log.Fatal(err)
	}
	fmt.Println("sent", <-sent)
	// Output:
	// sent welcome mail
}

// ExampleWithTx enqueues a job in the transaction that writes the order:
// the job exists if and only if the order commits.
func ExampleWithTx() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "shop")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	backend, err := sqlite.New(ctx, sqlite.Config{Path: filepath.Join(dir, "shop.db")})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	db := backend.DB() // the application's tables may live in the same file
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}
	p, err := ap.New(backend, ap.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	order := func(id int, commit bool) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (?)`, id); err != nil {
			return err
		}
		if err := p.Enqueue(sqlite.WithTx(ctx, tx), &ap.Job{Type: "order.confirm", Payload: []byte(strconv.Itoa(id))}); err != nil {
			return err
		}
		if !commit {
			return tx.Rollback() // the order and its job vanish together
		}
		return tx.Commit()
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
	dir, err := os.MkdirTemp("", "ship")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	backend, err := sqlite.New(ctx, sqlite.Config{Path: filepath.Join(dir, "shop.db")})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	db := backend.DB()
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY, shipped BOOLEAN NOT NULL DEFAULT false)`); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO orders (id) VALUES (42)`); err != nil {
		log.Fatal(err)
	}
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
	_ = p.Handle("order.ship", func(ctx context.Context, job *ap.Job) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `UPDATE orders SET shipped = true WHERE id = ?`, string(job.Payload)); err != nil {
			return err
		}
		if err := backend.CompleteTx(ctx, tx); err != nil {
			return err
		}
		return tx.Commit() // the job is done when tx commits
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
	if err := db.QueryRowContext(ctx, `SELECT shipped FROM orders WHERE id = 42`).Scan(&ok); err != nil {
		log.Fatal(err)
	}
	fmt.Println("shipped:", ok)
	// Output:
	// outcome: succeeded
	// shipped: true
}
