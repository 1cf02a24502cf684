package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

func testLeaseExtension(t *testing.T, e *env) {
	hold := 10 * e.lease
	slow := func(ctx context.Context, _ *ap.Job) error {
		select {
		case <-time.After(hold):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	job := &ap.Job{Type: "slow"}
	e.enqueue(e.producer(), job)
	for range 2 { // two workers compete for it
		e.worker(e.config()).handle(t, "slow", slow).start(t)
	}
	e.waitLonger(hold, "the slow job to finish", func() bool {
		o := e.rec.outcomes(job.ID)
		return len(o) > 0
	})
	e.settle()
	if o := e.rec.outcomes(job.ID); len(o) != 1 || o[0].Outcome != ap.OutcomeSucceeded {
		t.Errorf("outcomes %+v, want one success", o)
	}
	if n := e.rec.count(job.ID); n != 1 {
		t.Errorf("a handler running %v (10 leases) was delivered %d times, want 1", hold, n)
	}
}

func testStaleReceipt(t *testing.T, e *env) {
	ctx := ctxT(t, 2*e.opts.Wait)
	p := e.producer()
	job := &ap.Job{Type: "s"}
	e.enqueue(p, job)
	b1, b2 := e.backend(), e.backend()
	ds, err := b1.Receive(ctx, e.queue, 1, e.lease)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive: %v, %d deliveries", err, len(ds))
	}
	d1 := ds[0]
	if dis, ok := e.h.(Disconnecter); ok {
		if err := dis.Disconnect(ctx, b1); err != nil {
			t.Fatalf("Disconnect: %v", err)
		}
	}
	// b2 gets the job once b1's lease lapses (or its connection is cut).
	rctx, cancel := context.WithTimeout(ctx, e.opts.Wait)
	defer cancel()
	ds, err = b2.Receive(rctx, e.queue, 1, e.lease)
	if err != nil || len(ds) != 1 {
		t.Fatalf("the job never came back after the first lease was lost: %v", err)
	}
	d2 := ds[0]
	if d2.Deliveries != d1.Deliveries+1 {
		t.Errorf("second delivery counts %d, want %d", d2.Deliveries, d1.Deliveries+1)
	}
	for name, call := range map[string]func() error{
		"Ack":        func() error { return b1.Ack(ctx, d1) },
		"Extend":     func() error { return b1.Extend(ctx, d1, e.lease) },
		"Requeue":    func() error { return b1.Requeue(ctx, d1, driver.Message{ID: job.ID + ".x", Body: d1.Body}) },
		"DeadLetter": func() error { return b1.DeadLetter(ctx, d1, driver.DeadMessage{ID: job.ID, Body: []byte("x")}) },
	} {
		if err := call(); !errors.Is(err, driver.ErrLeaseLost) {
			t.Errorf("%s with a stale receipt: got %v, want ErrLeaseLost", name, err)
		}
	}
	if err := b2.Ack(ctx, d2); err != nil {
		t.Fatalf("Ack of the live delivery: %v", err)
	}
	st, err := p.Stats(ctx, e.queue)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 0 && st.Ready != -1 || st.Dead > 0 {
		t.Errorf("after the live ack the queue has %+v; the stale calls must not have acted", st)
	}
}
