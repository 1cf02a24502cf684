package postgres

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// endsAfterFirstLook is a context whose Err is nil at its first call and
// Canceled after: it ends while the claim's statement runs.
type endsAfterFirstLook struct {
	context.Context
	looks atomic.Int32
}

func (c *endsAfterFirstLook) Err() error {
	if c.looks.Add(1) == 1 {
		return nil
	}
	return context.Canceled
}

// TestClaimPutBackUncounted: jobs claimed for a Receive whose context
// ended during the claim are put back at once, uncounted.
func TestClaimPutBackUncounted(t *testing.T) {
	t.Parallel()
	reachable(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := New(ctx, Config{URL: testURL(), Prefix: testPrefix(t, "claim")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const q = "put-back"
	defer b.DeleteQueue(context.Background(), q)
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "m", Body: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.claim(&endsAfterFirstLook{Context: ctx}, q, 10, time.Hour)
	if !errors.Is(err, context.Canceled) || len(ds) != 0 {
		t.Fatalf("claim under a context that ended: %d deliveries, %v; want none and context.Canceled", len(ds), err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	ds, err = b.Receive(rctx, q, 10, time.Minute)
	if err != nil {
		t.Fatalf("the put back job is not deliverable at once: %v", err)
	}
	if len(ds) != 1 || ds[0].Deliveries != 1 || string(ds[0].Body) != "x" {
		t.Fatalf("got %d deliveries (first: %+v), want the job once with Deliveries 1", len(ds), ds)
	}
}
