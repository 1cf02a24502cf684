package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// A NotBefore a nanosecond past a whole microsecond, given to
// Enqueue, to Enqueue under OutboxTx and to Requeue, is stored no earlier
// than itself (run_at / not_before rounded up, not down).
func TestNotBeforeStoredNotEarlyReview8(t *testing.T) {
	t.Parallel()
	reachable(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prefix := testPrefix(t, "nbr8")
	b, err := New(ctx, Config{URL: testURL(), Prefix: prefix, MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const q = "nb-review8"
	nb := time.UnixMicro(time.Now().Add(time.Hour).UnixMicro()).Add(time.Nanosecond)
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "a", Body: []byte("a"), NotBefore: nb}}); err != nil {
		t.Fatal(err)
	}
	runAt := func() []time.Time {
		rows, err := b.pool.Query(ctx, `SELECT run_at FROM `+prefix+`_jobs WHERE queue = $1 AND token = 0`, q)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []time.Time
		for rows.Next() {
			var ts time.Time
			if err := rows.Scan(&ts); err != nil {
				t.Fatal(err)
			}
			out = append(out, ts)
		}
		return out
	}
	for _, ts := range runAt() {
		if ts.Before(nb) {
			t.Errorf("Enqueue: run_at %d before the NotBefore %d", ts.UnixNano(), nb.UnixNano())
		}
	}

	// Requeue: a ready message received, requeued with the NotBefore.
	if err := b.Enqueue(ctx, q+"2", []driver.Message{{ID: "b", Body: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	ds, err := b.Receive(rctx, q+"2", 1, time.Minute)
	rcancel()
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %d, %v", len(ds), err)
	}
	if err := b.Requeue(ctx, ds[0], driver.Message{ID: "b", Body: []byte("b"), NotBefore: nb}); err != nil {
		t.Fatal(err)
	}
	var ts time.Time
	if err := b.pool.QueryRow(ctx, `SELECT run_at FROM `+prefix+`_jobs WHERE queue = $1`, q+"2").Scan(&ts); err != nil {
		t.Fatal(err)
	}
	if ts.Before(nb) {
		t.Errorf("Requeue: run_at %d before the NotBefore %d", ts.UnixNano(), nb.UnixNano())
	}

	// OutboxTx: the outbox row's not_before.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Enqueue(OutboxTx(ctx, tx), q+"3", []driver.Message{{ID: "c", Body: []byte("c"), NotBefore: nb}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(ctx, `SELECT not_before FROM `+prefix+`_outbox WHERE queue = $1`, q+"3").Scan(&ts); err != nil {
		t.Fatal(err)
	}
	if ts.Before(nb) {
		t.Errorf("OutboxTx: not_before %d before the NotBefore %d", ts.UnixNano(), nb.UnixNano())
	}
}
