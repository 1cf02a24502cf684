package sqlite

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// TestCompleteTx: a handler that writes a row and completes its job in
// its own transaction on the file: each job's row is written once and its
// outcome is a success (the platform's settle finds the job done, no lost
// lease); a first attempt whose transaction rolls back (after CompleteTx)
// and returns an error leaves no row and is retried.
func TestCompleteTx(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const queue = "complete"
	b, err := New(ctx, Config{Path: testPath(t, "complete")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.DB().ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
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
	// ship writes the order and completes the job in one transaction; the
	// first attempt of "rb-" jobs rolls back.
	ship := func(ctx context.Context, j *ap.Job) error {
		tx, err := b.DB().BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (?)`, j.ID); err != nil {
			return err
		}
		if err := b.CompleteTx(ctx, tx); err != nil {
			return err
		}
		if j.TryCount == 1 && j.ID[:3] == "rb-" {
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
			mu.Lock()
			t.Fatalf("not every job succeeded: %v", outcomes)
		}
	}
	var n int
	if err := b.DB().QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != len(ids) {
		t.Errorf("%d orders written, want %d", n, len(ids))
	}
	st, err := b.Stats(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready+st.Scheduled+st.InFlight+st.Dead != 0 {
		t.Errorf("after every job succeeded: %+v, want an empty queue", st)
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
}

// TestCompleteTxOutsideHandler: CompleteTx under a context that is no
// handler's is refused, and changes nothing.
func TestCompleteTxOutsideHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, err := New(ctx, Config{Path: testPath(t, "complete-outside")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	tx, err := b.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := b.CompleteTx(ctx, tx); !errors.Is(err, ErrNotInHandler) {
		t.Errorf("CompleteTx outside a handler: %v, want ErrNotInHandler", err)
	}
}
