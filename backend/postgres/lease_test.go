package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestLeaseFromClaim: a lease runs from when the claim takes the row, not
// from when its transaction began (now()): a claim that waited for the
// server (a loaded machine) must not hand out a lease already part spent,
// which the platform, timing its renewals from Receive's return, would let
// lapse. Here the claim runs 700ms into a transaction; its 1s lease must
// still have most of a second to run at the commit.
func TestLeaseFromClaim(t *testing.T) {
	t.Parallel()
	reachable(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := New(ctx, Config{URL: testURL(), Prefix: testPrefix(t, "leasefrom"), MaxConns: testConns})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const q = "lease-from"
	defer b.DeleteQueue(context.Background(), q)
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "m", Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	var left float64
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.7)`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, b.q.claim, q, 1, time.Second.Microseconds(), b.cfg.MaxBody+1)
		if err != nil {
			return err
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT extract(epoch FROM run_at - clock_timestamp()) FROM `+b.cfg.Prefix+`_jobs WHERE queue = $1`, q).Scan(&left)
	})
	if err != nil {
		t.Fatal(err)
	}
	if left < 0.5 {
		t.Fatalf("a 1s lease taken 700ms into the claim's transaction has %.3fs left: it ran from the transaction's start", left)
	}
}
