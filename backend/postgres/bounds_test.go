package postgres

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// boundsBundle is a Backend with a small MaxBody on tables of its own.
type boundsBundle struct {
	b   *Backend
	ctx context.Context
}

func setupBounds(t *testing.T, role, queue string) *boundsBundle {
	t.Helper()
	reachable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	b, err := New(ctx, Config{URL: testURL(), Prefix: testPrefix(t, role), MaxBody: 4096, MaxConns: testConns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = b.DeleteQueue(context.Background(), queue)
		b.Close()
	})
	return &boundsBundle{b: b, ctx: ctx}
}

// TestClaimBoundsForeignBody: a row written by someone else with a body
// far over MaxBody is handed out cut to MaxBody+1 bytes (the platform
// dead-letters it as not a job), never read whole.
func TestClaimBoundsForeignBody(t *testing.T) {
	t.Parallel()
	const q = "bounds-claim"
	tb := setupBounds(t, "bclaim", q)
	big := bytes.Repeat([]byte{'x'}, 1<<20)
	if _, err := tb.b.pool.Exec(tb.ctx, `INSERT INTO `+tb.b.cfg.Prefix+`_jobs (queue, body, run_at) VALUES ($1, $2, now())`, q, big); err != nil {
		t.Fatal(err)
	}
	ds, err := tb.b.Receive(tb.ctx, q, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 || len(ds[0].Body) != 4097 {
		t.Fatalf("got %d deliveries, the first with a %d-byte body; want one cut to 4097 bytes", len(ds), len(ds[0].Body))
	}
}

// TestDeadBoundsForeignRecord: a dead-letter row written by someone else
// with an ID and a body over their limits is read cut, by NextDead and
// ListDead.
func TestDeadBoundsForeignRecord(t *testing.T) {
	t.Parallel()
	const q = "bounds-dead"
	tb := setupBounds(t, "bdead", q)
	id := bytes.Repeat([]byte{'i'}, 1<<20)
	body := bytes.Repeat([]byte{'b'}, 3<<20)
	if _, err := tb.b.pool.Exec(tb.ctx, `INSERT INTO `+tb.b.cfg.Prefix+`_dead (queue, rec_id, body) VALUES ($1, $2, $3)`, q, id, body); err != nil {
		t.Fatal(err)
	}
	wantID, wantBody := maxDeadID+1, tb.b.maxDeadBody()+1
	recs, _, err := tb.b.ListDead(tb.ctx, q, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || len(recs[0].ID) != wantID || len(recs[0].Body) != wantBody {
		t.Fatalf("ListDead: %d records, the first with a %d-byte ID and a %d-byte body; want one cut to %d and %d", len(recs), len(recs[0].ID), len(recs[0].Body), wantID, wantBody)
	}
	d, err := tb.b.NextDead(tb.ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.ID) != wantID || len(d.Body) != wantBody {
		t.Fatalf("NextDead: a %d-byte ID and a %d-byte body; want them cut to %d and %d", len(d.ID), len(d.Body), wantID, wantBody)
	}
}

// TestDeadLetterRefusesOverLimit: a record the backend could not read
// back whole is refused with ErrTooLarge, and the job stays held.
func TestDeadLetterRefusesOverLimit(t *testing.T) {
	t.Parallel()
	const q = "bounds-write"
	tb := setupBounds(t, "bwrite", q)
	if err := tb.b.Enqueue(tb.ctx, q, []driver.Message{{ID: "m", Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	ds, err := tb.b.Receive(tb.ctx, q, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range []driver.DeadMessage{
		{ID: strings.Repeat("i", maxDeadID+1), Body: []byte("r")},
		{ID: "m", Body: make([]byte, tb.b.maxDeadBody()+1)},
	} {
		if err := tb.b.DeadLetter(tb.ctx, ds[0], rec); !errors.Is(err, driver.ErrTooLarge) {
			t.Fatalf("DeadLetter of a %d-byte ID and a %d-byte body: %v, want ErrTooLarge", len(rec.ID), len(rec.Body), err)
		}
	}
	if err := tb.b.Ack(tb.ctx, ds[0]); err != nil {
		t.Fatalf("Ack after the refused dead letters: %v", err)
	}
}

// TestListDeadMaxLimit: a limit of math.MaxInt lists the records (and
// pages at maxList), without an overflow of limit+1.
func TestListDeadMaxLimit(t *testing.T) {
	t.Parallel()
	const q = "bounds-list"
	tb := setupBounds(t, "blist", q)
	if _, err := tb.b.pool.Exec(tb.ctx, `INSERT INTO `+tb.b.cfg.Prefix+`_dead (queue, rec_id, body) SELECT $1, ('r' || i)::bytea, 'b' FROM generate_series(1, $2::int) i`, q, maxList+5); err != nil {
		t.Fatal(err)
	}
	recs, next, err := tb.b.ListDead(tb.ctx, q, "", math.MaxInt)
	if err != nil {
		t.Fatalf("ListDead with limit MaxInt: %v", err)
	}
	if len(recs) != maxList || next == "" {
		t.Fatalf("ListDead with limit MaxInt: %d records, cursor %q; want a page of %d and a cursor", len(recs), next, maxList)
	}
	rest, next, err := tb.b.ListDead(tb.ctx, q, next, math.MaxInt)
	if err != nil || len(rest) != 5 || next != "" {
		t.Fatalf("second page: %d records, cursor %q, %v; want the last 5 and no cursor", len(rest), next, err)
	}
}
