package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// The helpers of the cases that call the backend directly, as the platform
// does, to pin down one rule of driver.Backend each: a platform hides some
// breakages (it retries, or the next claim repairs what one call left).

// declared opens a backend and declares the case's queue with it.
func (e *env) declared() driver.Backend {
	e.t.Helper()
	b := e.backend()
	if err := b.Declare(ctxT(e.t, e.opts.Wait), e.queue); err != nil {
		e.t.Fatalf("Declare(%q): %v", e.queue, err)
	}
	return b
}

// put enqueues one message per body, in one Enqueue, and returns their IDs.
func (e *env) put(b driver.Backend, notBefore time.Time, bodies ...string) []string {
	e.t.Helper()
	msgs := make([]driver.Message, len(bodies))
	ids := make([]string, len(bodies))
	for i, body := range bodies {
		ids[i] = e.queue + "-" + body
		msgs[i] = driver.Message{ID: ids[i], Body: []byte(body), NotBefore: notBefore}
	}
	if err := b.Enqueue(ctxT(e.t, e.opts.Wait), e.queue, msgs); err != nil {
		e.t.Fatalf("Enqueue: %v", err)
	}
	return ids
}

// bodies names n messages: prefix-0, prefix-1, ...
func bodies(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// receiveN receives until it holds n deliveries, each under lease.
func (e *env) receiveN(b driver.Backend, n int, lease time.Duration) []*driver.Delivery {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.Wait)
	defer cancel()
	var out []*driver.Delivery
	for len(out) < n {
		ds, err := b.Receive(ctx, e.queue, n-len(out), lease)
		out = append(out, ds...)
		if err != nil {
			e.t.Fatalf("Receive: got %d of %d messages, then: %v%s", len(out), n, err, e.stallNote())
		}
	}
	if len(out) > n {
		e.t.Fatalf("Receive(max %d) handed out %d messages", n, len(out))
	}
	return out
}

// receiveWithin receives until it holds n deliveries or within has passed,
// and returns what it got.
func (e *env) receiveWithin(b driver.Backend, n int, lease, within time.Duration) []*driver.Delivery {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var out []*driver.Delivery
	for len(out) < n {
		ds, err := b.Receive(ctx, e.queue, n-len(out), lease)
		out = append(out, ds...)
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			e.t.Fatalf("Receive: %v", err)
		}
	}
	return out
}

// received is what a Receive running in the background returned, and when.
type received struct {
	ds  []*driver.Delivery
	err error
	at  time.Time
}

// receiveAsync starts a Receive of one message and returns where its result
// arrives.
func receiveAsync(ctx context.Context, b driver.Backend, queue string, lease time.Duration) <-chan received {
	ch := make(chan received, 1)
	go func() {
		ds, err := b.Receive(ctx, queue, 1, lease)
		ch <- received{ds, err, time.Now()}
	}()
	return ch
}

// makeDeadRaw dead-letters n messages through b and returns the records in
// the order they were written (oldest first).
func (e *env) makeDeadRaw(b driver.Backend, n int) []driver.DeadMessage {
	e.t.Helper()
	e.put(b, time.Time{}, bodies("dead", n)...)
	ctx := ctxT(e.t, e.opts.Wait)
	var recs []driver.DeadMessage
	for i, d := range e.receiveN(b, n, e.opts.Wait) {
		rec := driver.DeadMessage{ID: fmt.Sprintf("%s-rec-%d", e.queue, i), Body: append([]byte("record of "), d.Body...)}
		if err := b.DeadLetter(ctx, d, rec); err != nil {
			e.t.Fatalf("DeadLetter: %v", err)
		}
		recs = append(recs, rec)
	}
	return recs
}

// listDead pages through the whole dead-letter queue with b and returns the
// records' IDs.
func (e *env) listDead(b driver.Backend) []string {
	e.t.Helper()
	ctx := ctxT(e.t, e.opts.Wait)
	var ids []string
	seen := map[string]bool{}
	for cursor := ""; ; {
		recs, next, err := b.ListDead(ctx, e.queue, cursor, 100)
		if err != nil {
			e.t.Fatalf("ListDead: %v", err)
		}
		for _, r := range recs {
			ids = append(ids, r.ID)
		}
		if cursor = next; cursor == "" {
			return ids
		}
		e.cursorAdvances(seen, cursor)
	}
}

// ack acknowledges deliveries that the case is done with.
func (e *env) ack(b driver.Backend, ds ...*driver.Delivery) {
	e.t.Helper()
	ctx := ctxT(e.t, e.opts.Wait)
	for _, d := range ds {
		if err := b.Ack(ctx, d); err != nil {
			e.t.Errorf("Ack of a live delivery: %v", err)
		}
	}
}

// ackFresh acks d, a delivery just received. Its lease runs from the claim,
// which a Receive slowed by a stalled broker may have mostly spent, so it is
// renewed first: a lease lost before the renewal, or to a stall as long as
// the lease after it, is logged and not judged; any other error fails.
func (e *env) ackFresh(b driver.Backend, d *driver.Delivery) {
	e.t.Helper()
	ctx := ctxT(e.t, e.opts.Wait)
	at := time.Now()
	err := b.Extend(ctx, d, e.lease)
	if errors.Is(err, driver.ErrLeaseLost) {
		e.t.Logf("the lease of a delivery ran out before its Receive returned%s: its Ack is not judged", e.stallNote())
		return
	}
	if err == nil {
		err = b.Ack(ctx, d)
	}
	if took := time.Since(at); errors.Is(err, driver.ErrLeaseLost) && took >= e.lease*9/10 {
		e.t.Logf("the Ack of a live delivery came %v after its renewal, past nine tenths of its %v lease%s: not judged", took.Round(time.Millisecond), e.lease, e.stallNote())
		return
	}
	if err != nil {
		e.t.Errorf("Ack of a live delivery: %v", err)
	}
}

// leaseLost checks that a settle with a receipt that no longer holds its
// message was refused with driver.ErrLeaseLost.
func leaseLost(t *testing.T, call string, err error, why string) {
	t.Helper()
	if !errors.Is(err, driver.ErrLeaseLost) {
		t.Errorf("%s %s: got %v, want driver.ErrLeaseLost", call, why, err)
	}
}

// sameSet reports whether a and b hold the same strings, in any order.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
