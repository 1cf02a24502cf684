package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	ap "github.com/asyncplatform/asyncplatform"
)

// TestCompleteTx: a handler that writes a row and completes its job in
// its own transaction: each job's row is written once and its outcome is
// a success (the platform's settle finds the job done, no lost lease);
// a first attempt whose transaction rolls back (after CompleteTx) and
// returns an error leaves no row and is retried. For a pgx.Tx and a
// *sql.Tx.
func TestCompleteTx(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"pgx", "sql"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			reachable(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			queue := "complete-" + kind
			pool, err := pgxpool.New(ctx, testURL()+"&pool_max_conns=8")
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			prefix := testPrefix(t, "complete"+kind)
			b, err := New(ctx, Config{Pool: pool, Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			defer b.DeleteQueue(context.Background(), queue)
			orders := prefix + "_orders"
			if _, err := pool.Exec(ctx, `CREATE TABLE `+orders+` (id text PRIMARY KEY)`); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+orders) })
			db := stdlib.OpenDBFromPool(pool)
			defer db.Close()

			var (
				mu       sync.Mutex
				outcomes = map[string][]ap.Outcome{}
				done     = make(chan string, 100)
			)
			p, err := ap.New(b, ap.Config{
				Logger: slog.New(slog.DiscardHandler),
				Queues: map[string]ap.QueueConfig{queue: {Concurrency: 4}},
				Hooks: ap.Hooks{AfterAttempt: func(_ context.Context, a ap.Attempt) {
					mu.Lock()
					outcomes[a.Job.ID] = append(outcomes[a.Job.ID], a.Outcome)
					mu.Unlock()
					if a.Outcome != ap.OutcomeRetried {
						done <- a.Job.ID // checked below
					}
				}},
			})
			if err != nil {
				t.Fatal(err)
			}
			errRolledBack := errors.New("rolled back")
			// ship writes the order and completes the job in one
			// transaction; the first attempt of "rb-" jobs rolls back.
			ship := func(ctx context.Context, j *ap.Job) error {
				commit := j.TryCount > 1 || j.ID[:3] != "rb-"
				if kind == "pgx" {
					tx, err := pool.Begin(ctx)
					if err != nil {
						return err
					}
					defer tx.Rollback(ctx)
					if _, err := tx.Exec(ctx, `INSERT INTO `+orders+` (id) VALUES ($1)`, j.ID); err != nil {
						return err
					}
					if err := b.CompleteTx(ctx, tx); err != nil {
						return err
					}
					if !commit {
						return errRolledBack
					}
					return tx.Commit(ctx)
				}
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, `INSERT INTO `+orders+` (id) VALUES ($1)`, j.ID); err != nil {
					return err
				}
				if err := b.CompleteSQLTx(ctx, tx); err != nil {
					return err
				}
				if !commit {
					return errRolledBack
				}
				return tx.Commit()
			}
			if err := p.Handle("ship", ship); err != nil {
				t.Fatal(err)
			}
			var ids []string
			for i := range 10 {
				ids = append(ids, fmt.Sprintf("ok-%d", i))
			}
			ids = append(ids, "rb-0", "rb-1")
			for _, id := range ids {
				if err := p.Enqueue(ctx, &ap.Job{ID: id, Type: "ship", Queue: queue, Policy: ap.Policy{BackoffBase: 10 * time.Millisecond}}); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer p.Stop(context.Background())
			for range ids {
				select {
				case <-done:
				case <-ctx.Done():
					t.Fatalf("not every job succeeded: %v", outcomes)
				}
			}
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+orders).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != len(ids) {
				t.Errorf("%d orders written, want %d", n, len(ids))
			}
			mu.Lock()
			defer mu.Unlock()
			for _, id := range ids {
				want := []ap.Outcome{ap.OutcomeSucceeded}
				if id[:3] == "rb-" {
					want = []ap.Outcome{ap.OutcomeRetried, ap.OutcomeSucceeded}
				}
				if fmt.Sprint(outcomes[id]) != fmt.Sprint(want) {
					t.Errorf("job %s: outcomes %v, want %v", id, outcomes[id], want)
				}
			}
		})
	}
}

// TestCompleteTxOutsideHandler: CompleteTx under a context that is no
// handler's is refused.
func TestCompleteTxOutsideHandler(t *testing.T) {
	t.Parallel()
	reachable(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := New(ctx, Config{URL: testURL(), Prefix: testPrefix(t, "complout"), MaxConns: testConns})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return b.CompleteTx(ctx, tx) })
	if !errors.Is(err, ErrNotInHandler) {
		t.Errorf("CompleteTx outside a handler: %v, want ErrNotInHandler", err)
	}
}
