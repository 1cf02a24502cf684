package sqlite

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// txBundle is a platform on a backend of its own, recording every run of
// its "tx" jobs.
type txBundle struct {
	b *Backend
	p *ap.Platform

	mu   sync.Mutex
	runs map[string]int
	ran  chan string
}

func setupTx(t *testing.T, queue string) *txBundle {
	t.Helper()
	ctx := context.Background()
	b, err := New(ctx, Config{Path: testPath(t, "tx-"+queue)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	p, err := ap.New(b, ap.Config{Queues: map[string]ap.QueueConfig{queue: {Concurrency: 10}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	tb := &txBundle{b: b, p: p, runs: map[string]int{}, ran: make(chan string, 10000)}
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

// enqueueIn enqueues a job of ID id in a transaction of the backend's
// pool, with a row of the caller's own beside it, and commits or rolls
// it back.
func (tb *txBundle) enqueueIn(ctx context.Context, queue, id string, commit, unique bool) error {
	job := &ap.Job{ID: id, Type: "tx", Queue: queue, Payload: []byte(id)}
	if unique {
		job.UniqueKey = "u-" + id
	}
	tx, err := tb.b.DB().BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (?)`, id); err != nil {
		tx.Rollback()
		return err
	}
	if err := tb.p.Enqueue(WithTx(ctx, tx), job); err != nil {
		tx.Rollback()
		return err
	}
	if commit {
		return tx.Commit()
	}
	return tx.Rollback()
}

// TestEnqueueTx: of 400 transactions that each write a row of the
// caller's and enqueue a job, half at random are rolled back; exactly the
// committed half's jobs run, each once, and exactly their rows remain.
// Workers run throughout; with unique keys, the keys' store records go
// through the transaction too.
func TestEnqueueTx(t *testing.T) {
	t.Parallel()
	for _, unique := range []bool{false, true} {
		t.Run(fmt.Sprintf("unique=%v", unique), func(t *testing.T) {
			t.Parallel()
			queue := fmt.Sprintf("tx-%v", unique)
			tb := setupTx(t, queue)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if _, err := tb.b.DB().ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY)`); err != nil {
				t.Fatal(err)
			}
			const n = 400
			commit := make([]bool, n)
			for i := range commit {
				commit[i] = i < n/2
			}
			rand.Shuffle(n, func(i, j int) { commit[i], commit[j] = commit[j], commit[i] })
			var wg sync.WaitGroup
			errs := make(chan error, n)
			next := make(chan int)
			for range 4 {
				wg.Go(func() {
					for i := range next {
						if err := tb.enqueueIn(ctx, queue, fmt.Sprintf("j-%04d", i), commit[i], unique); err != nil {
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
			var rows int
			if err := tb.b.DB().QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if rows != n/2 {
				t.Errorf("%d orders remain, want the %d committed", rows, n/2)
			}
			tb.mu.Lock()
			defer tb.mu.Unlock()
			for i := range n {
				id := fmt.Sprintf("j-%04d", i)
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
// claimed; at commit it runs.
func TestEnqueueTxOpen(t *testing.T) {
	t.Parallel()
	const queue = "tx-open"
	tb := setupTx(t, queue)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tx, err := tb.b.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := tb.p.Enqueue(WithTx(ctx, tx), &ap.Job{ID: "in-tx", Type: "tx", Queue: queue}); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-tb.ran:
		t.Fatalf("ran %s while its transaction was open", got)
	case <-time.After(3 * PollInterval):
	}
	if err := tx.Commit(); err != nil {
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
