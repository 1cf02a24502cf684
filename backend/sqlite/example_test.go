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
