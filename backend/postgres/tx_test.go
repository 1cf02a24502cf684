package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	ap "github.com/asyncplatform/asyncplatform"
)

// txBundle is a platform on a backend of its own, recording every run of
// its "tx" jobs.
type txBundle struct {
	b    *Backend
	p    *ap.Platform
	pool *pgxpool.Pool
	db   *sql.DB

	mu   sync.Mutex
	runs map[string]int
	ran  chan string
}

func setupTx(t *testing.T, role, queue string) *txBundle {
	t.Helper()
	reachable(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testURL()+"&pool_max_conns=20") // room for the 8 open transactions and the workers
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b, err := New(ctx, Config{Pool: pool, Prefix: testPrefix(t, role)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = b.DeleteQueue(context.Background(), queue)
		b.Close()
	})
	p, err := ap.New(b, ap.Config{Queues: map[string]ap.QueueConfig{queue: {Concurrency: 10}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	tb := &txBundle{b: b, p: p, pool: pool, db: db, runs: map[string]int{}, ran: make(chan string, 10000)}
	if err := p.Handle("tx", func(ctx context.Context, j *ap.Job) error {
		tb.mu.Lock()
		tb.runs[j.ID]++
		tb.mu.Unlock()
		tb.ran <- j.ID
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = p.Stop(ctx)
	})
	return tb
}

// enqueueIn enqueues a job of ID id in a transaction of the given kind
// ("pgx" or "sql") and commits or rolls it back.
func (tb *txBundle) enqueueIn(ctx context.Context, kind, queue, id string, commit bool) error {
	job := &ap.Job{ID: id, Type: "tx", Queue: queue, Payload: []byte(id)}
	switch kind {
	case "pgx":
		tx, err := tb.pool.Begin(ctx)
		if err != nil {
			return err
		}
		if err := tb.p.Enqueue(WithTx(ctx, tx), job); err != nil {
			tx.Rollback(ctx)
			return err
		}
		if commit {
			return tx.Commit(ctx)
		}
		return tx.Rollback(ctx)
	default:
		tx, err := tb.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := tb.p.Enqueue(WithSQLTx(ctx, tx), job); err != nil {
			tx.Rollback()
			return err
		}
		if commit {
			return tx.Commit()
		}
		return tx.Rollback()
	}
}

// TestEnqueueTx: of 1,000 transactions that each enqueue a job, half at
// random are rolled back; exactly the committed half's jobs run, each
// once. Workers run throughout, so they are woken at each commit.
func TestEnqueueTx(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"pgx", "sql"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			queue := "tx-" + kind
			tb := setupTx(t, "tx"+kind, queue)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			const n = 1000
			commit := make([]bool, n)
			for i := range commit {
				commit[i] = i < n/2
			}
			rand.Shuffle(n, func(i, j int) { commit[i], commit[j] = commit[j], commit[i] })
			var wg sync.WaitGroup
			errs := make(chan error, n)
			next := make(chan int)
			for range 8 {
				wg.Go(func() {
					for i := range next {
						if err := tb.enqueueIn(ctx, kind, queue, fmt.Sprintf("%s-%04d", kind, i), commit[i]); err != nil {
							errs <- err
						}
					}
				})
			}
			for i := range n {
				next <- i
			}
			close(next)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			for got := 0; got < n/2; got++ {
				select {
				case <-tb.ran:
				case <-ctx.Done():
					t.Fatalf("%d of %d committed jobs ran", got, n/2)
				}
			}
			// Every committed job ran; wait for the queue to be empty, so
			// that a second run or a rolled back job would show.
			for {
				s, err := tb.b.Stats(ctx, queue)
				if err != nil {
					t.Fatal(err)
				}
				if s.Ready+s.Scheduled+s.InFlight+s.Dead == 0 {
					break
				}
				select {
				case <-ctx.Done():
					t.Fatalf("queue not empty: %+v", s)
				case <-time.After(50 * time.Millisecond):
				}
			}
			tb.mu.Lock()
			defer tb.mu.Unlock()
			for i := range n {
				id := fmt.Sprintf("%s-%04d", kind, i)
				want := 0
				if commit[i] {
					want = 1
				}
				if got := tb.runs[id]; got != want {
					t.Errorf("job %s (committed %v) ran %d times, want %d", id, commit[i], got, want)
				}
			}
		})
	}
}

// TestEnqueueTxOpen: a job enqueued in a transaction still open is never
// claimed, while jobs enqueued after it run; at commit it runs.
func TestEnqueueTxOpen(t *testing.T) {
	t.Parallel()
	const queue = "tx-open"
	tb := setupTx(t, "txopen", queue)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tx, err := tb.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tb.p.Enqueue(WithTx(ctx, tx), &ap.Job{ID: "in-tx", Type: "tx", Queue: queue}); err != nil {
		t.Fatal(err)
	}
	// Jobs enqueued after it, outside, run: the workers claim all the
	// while, and pass the open transaction's row by.
	for i := range 20 {
		id := fmt.Sprintf("after-%d", i)
		if err := tb.p.Enqueue(ctx, &ap.Job{ID: id, Type: "tx", Queue: queue}); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-tb.ran:
			if got != id {
				t.Fatalf("ran %s, want %s: a job of an open transaction was claimed", got, id)
			}
		case <-ctx.Done():
			t.Fatalf("job %s did not run", id)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-tb.ran:
		if got != "in-tx" {
			t.Fatalf("ran %s, want in-tx", got)
		}
	case <-ctx.Done():
		t.Fatal("the committed job did not run")
	}
}
