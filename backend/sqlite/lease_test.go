package sqlite

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestLeaseFromClaim: a claim that waited for another writer's
// transaction hands out a whole lease, counted from when it got the write
// lock, not from when it asked for it.
func TestLeaseFromClaim(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := New(ctx, Config{Path: filepath.Join(t.TempDir(), "lease.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Enqueue(ctx, "lease", []driver.Message{{ID: "1", Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Declare(ctx, "lease"); err != nil {
		t.Fatal(err)
	}
	b.seen.Store("lease", struct{}{})   // the Receive's first write is its claim
	tx, err := b.DB().BeginTx(ctx, nil) // IMMEDIATE: holds the write lock
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		ds  []*driver.Delivery
		err error
	}
	res := make(chan result, 1)
	const lease, held = 2 * time.Second, 1500 * time.Millisecond
	go func() {
		ds, err := b.Receive(ctx, "lease", 1, lease)
		res <- result{ds, err}
	}()
	time.Sleep(held) // the claim waits for tx meanwhile
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil || len(r.ds) != 1 {
		t.Fatalf("Receive: %d deliveries, %v", len(r.ds), r.err)
	}
	var left int64
	if err := b.db.QueryRowContext(ctx, `SELECT run_at - `+now+` FROM asyncplatform_jobs`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	// The claim got the lock when tx ended, moments ago: nearly all the
	// lease is left. Counted from the request, at most lease-held would be.
	if got := time.Duration(left) * time.Millisecond; got <= lease-held+200*time.Millisecond {
		t.Errorf("%v of a %v lease left just after a claim that waited %v for the write lock: the lease ran from before the wait", got, lease, held)
	}
}

// TestWakeUpOfItsPrefix: an Enqueue wakes an idle Receive of its own
// tables, not one of a Backend of another prefix on the same file that
// waits on a queue of the same name (which would find nothing and leave
// the job to the next poll).
func TestWakeUpOfItsPrefix(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "prefixes.db")
	a, err := New(ctx, Config{Path: path, Prefix: "pa"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	other, err := New(ctx, Config{Path: path, Prefix: "pb"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	// Idle Receives, as receiveOnce registers them: the other prefix's first.
	_, doneOther := other.hub.wait(other.waitKey("q"))
	defer doneOther(true)
	woken, done := a.hub.wait(a.waitKey("q"))
	defer done(true)
	if err := a.Enqueue(ctx, "q", []driver.Message{{Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-woken:
	default:
		t.Fatal("the Enqueue did not wake the idle Receive of its own prefix (its wake-up went to the other prefix's)")
	}
}
