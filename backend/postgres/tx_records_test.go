package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	ap "github.com/asyncplatform/asyncplatform"
)

// TestEnqueueTxRecords: the unique keys and status records of a batch
// enqueued in a transaction join it: a rollback leaves neither (the keys
// can be taken again, no status is found), a commit keeps both, for a
// pgx.Tx and a *sql.Tx. The batch's status records are written from
// several goroutines, on the one transaction.
func TestEnqueueTxRecords(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"pgx", "sql"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			reachable(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			queue := "txrec-" + kind
			pool, err := pgxpool.New(ctx, testURL())
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			b, err := New(ctx, Config{Pool: pool, Prefix: testPrefix(t, "txrec"+kind)})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			defer b.DeleteQueue(context.Background(), queue)
			p, err := ap.New(b, ap.Config{TrackStatus: true, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			db := stdlib.OpenDBFromPool(pool)
			defer db.Close()

			batch := func(round string) []*ap.Job {
				var jobs []*ap.Job
				for i := range 3 {
					jobs = append(jobs, &ap.Job{ID: fmt.Sprintf("%s-%s-%d", kind, round, i), Type: "t", Queue: queue,
						UniqueKey: fmt.Sprintf("key-%d", i), UniqueWindow: time.Hour})
				}
				return jobs
			}
			// in enqueues the batch in a transaction and commits it or not.
			in := func(jobs []*ap.Job, commit bool) error {
				if kind == "pgx" {
					tx, err := pool.Begin(ctx)
					if err != nil {
						return err
					}
					defer tx.Rollback(ctx)
					if err := p.EnqueueBatch(WithTx(ctx, tx), jobs); err != nil {
						return err
					}
					if commit {
						return tx.Commit(ctx)
					}
					return tx.Rollback(ctx)
				}
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if err := p.EnqueueBatch(WithSQLTx(ctx, tx), jobs); err != nil {
					return err
				}
				if commit {
					return tx.Commit()
				}
				return tx.Rollback()
			}

			rolledBack := batch("rolled-back")
			if err := in(rolledBack, false); err != nil {
				t.Fatal(err)
			}
			for _, j := range rolledBack {
				if st, err := p.Status(ctx, j.ID); !errors.Is(err, ap.ErrJobNotFound) {
					t.Errorf("job %s of a rolled back transaction has a status: %+v, %v", j.ID, st, err)
				}
			}
			committed := batch("committed")
			if err := in(committed, true); err != nil {
				t.Fatalf("a batch with the unique keys of a rolled back one: %v", err)
			}
			for _, j := range committed {
				if _, err := p.Status(ctx, j.ID); err != nil {
					t.Errorf("job %s of a committed transaction: status %v", j.ID, err)
				}
			}
			err = p.Enqueue(ctx, batch("again")[0])
			if !errors.Is(err, ap.ErrDuplicate) {
				t.Errorf("a unique key committed in a transaction taken again: %v, want ErrDuplicate", err)
			}
		})
	}
}
