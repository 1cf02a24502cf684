package postgres

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestAckBatch: concurrent Acks are committed together, in far fewer
// statements than acks, and each caller still gets its own result: a
// stale token, a lapsed lease, and a stale receipt of a row acked in the
// same statement by its current holder are each that caller's lease lost,
// and their rows (but the last) stay.
func TestAckBatch(t *testing.T) {
	t.Parallel()
	reachable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := New(ctx, Config{URL: testURL(), Prefix: testPrefix(t, "ackbatch"), MaxConns: testConns})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const q, n = "ack-batch", 100
	msgs := make([]driver.Message, n)
	for i := range msgs {
		msgs[i] = driver.Message{ID: strconv.Itoa(i), Body: []byte("x")}
	}
	if err := b.Enqueue(ctx, q, msgs); err != nil {
		t.Fatal(err)
	}
	var ds []*driver.Delivery
	for len(ds) < n {
		got, err := b.Receive(ctx, q, n-len(ds), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, got...)
	}

	// ds[0:5]: a token that was never handed out.
	for _, d := range ds[:5] {
		h := d.Handle.(handle)
		d.Handle = handle{h.id, h.token + 1<<40}
	}
	// ds[5]: its lease has lapsed.
	lapsed := ds[5].Handle.(handle)
	if _, err := b.pool.Exec(ctx, `UPDATE `+b.cfg.Prefix+`_jobs SET run_at = now() - interval '1 second' WHERE id = $1`, lapsed.id); err != nil {
		t.Fatal(err)
	}
	// A stale receipt of ds[6]'s row, acked beside the current one.
	h6 := ds[6].Handle.(handle)
	stale := &driver.Delivery{Queue: q, Handle: handle{h6.id, h6.token - 1}}
	all := append([]*driver.Delivery{stale}, ds...)

	// Hold every statement until each ack is in one or queued: the first
	// ackFlights statements take what came first, and the rest go in the
	// next ones.
	exec := b.acks.exec
	var taken atomic.Int64
	b.acks.exec = func(ctx context.Context, hs []handle) ([]handle, error) {
		taken.Add(int64(len(hs)))
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			b.acks.mu.Lock()
			queued := len(b.acks.queue)
			b.acks.mu.Unlock()
			if int(taken.Load())+queued >= len(all) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		return exec(ctx, hs)
	}

	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, d := range all {
		wg.Go(func() { errs[i] = b.Ack(ctx, d) })
	}
	wg.Wait()

	if got := b.acks.stmts.Load(); got > 2*ackFlights {
		t.Errorf("%d concurrent acks ran %d statements; want at most %d", len(all), got, 2*ackFlights)
	}
	for i, err := range errs {
		lost := i <= 6 // stale, then ds[0:6]
		switch {
		case lost && !errors.Is(err, driver.ErrLeaseLost):
			t.Errorf("ack %d (a lost lease): %v; want ErrLeaseLost", i, err)
		case !lost && err != nil:
			t.Errorf("ack %d: %v", i, err)
		}
	}
	var left int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.cfg.Prefix+`_jobs WHERE queue = $1`, q).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 6 {
		t.Errorf("%d rows left; want the 6 whose acks lost their lease", left)
	}
}

// TestAckOwnResult: two receipts of one row in one statement, a stale one
// and its current holder's, each get their own result: the row deleted
// under the current token is no success for the stale receipt.
func TestAckOwnResult(t *testing.T) {
	t.Parallel()
	a := newAcker(func(ctx context.Context, hs []handle) ([]handle, error) {
		return []handle{{id: 1, token: 2}}, nil
	})
	stale := &ackReq{h: handle{id: 1, token: 1}, done: make(chan struct{})}
	current := &ackReq{h: handle{id: 1, token: 2}, done: make(chan struct{})}
	a.run([]*ackReq{stale, current})
	if !stale.gone || stale.err != nil {
		t.Errorf("the stale receipt: gone %v, %v; want its row not deleted", stale.gone, stale.err)
	}
	if current.gone || current.err != nil {
		t.Errorf("the current receipt: gone %v, %v; want its row deleted", current.gone, current.err)
	}
}
