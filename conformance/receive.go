package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// onTime bounds how late a backend may hand out a message that became
// deliverable (a due NotBefore, a lapsed lease, a closed connection) to a
// Receive already waiting: "soon after (within a second or so)", plus the
// backend's MinLease for backends that keep time in coarse steps (Azure's
// visibility timeouts are whole seconds).
func (e *env) onTime() time.Duration { return e.bound(time.Second) + e.caps.MinLease }

// testReceiveBatch: Receive on an empty queue blocks until its ctx ends and
// returns ctx.Err(); a batch Enqueue stores every message; Receive hands
// out at most max at a time, each body exactly as stored and counted 1.
func testReceiveBatch(t *testing.T, e *env) {
	b := e.declared()
	wait := e.scaled(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	start := time.Now()
	ds, err := b.Receive(ctx, e.queue, 1, e.lease)
	took := time.Since(start)
	cancel()
	if len(ds) > 0 || !errors.Is(err, context.DeadlineExceeded) || took < wait*9/10 {
		t.Errorf("Receive on an empty queue with a ctx of %v returned %d deliveries and %v after %v; "+
			"it must block until a message is available or its ctx ends, and then return ctx.Err()", wait, len(ds), err, took.Round(time.Millisecond))
	}
	sent := bodies("batch", 5)
	sent = append(sent, "", "\x00\xff binary \xfe")
	e.put(b, time.Time{}, sent...)
	const max = 2
	var got []string
	rctx := ctxT(t, e.opts.Wait)
	for len(got) < len(sent) {
		ds, err := b.Receive(rctx, e.queue, max, e.lease)
		if len(ds) > max {
			t.Errorf("Receive(max %d) handed out %d messages", max, len(ds))
		}
		for _, d := range ds {
			got = append(got, string(d.Body))
			if d.Deliveries != 1 {
				t.Errorf("a first delivery counts Deliveries %d, want 1", d.Deliveries)
			}
			if d.Queue != e.queue {
				t.Errorf("Delivery.Queue %q, want %q", d.Queue, e.queue)
			}
		}
		e.ack(b, ds...)
		if err != nil {
			t.Fatalf("after %d of the %d messages of one Enqueue, Receive: %v (received: %q)%s", len(got), len(sent), err, got, e.stallNote())
		}
	}
	if !sameSet(got, sent) {
		t.Errorf("received bodies %q, want exactly the bodies enqueued %q", got, sent)
	}
}

// testWakesOnEnqueue: a Receive waiting on an empty queue hands out a
// message enqueued meanwhile at once, however long it has waited. It
// measures five times, after idle waits from 50 ms to 2 s (a poller's
// phase then differs, and a Receive that stops being woken after a while
// shows), and judges the second slowest: one measurement may be a stall.
func testWakesOnEnqueue(t *testing.T, e *env) {
	send := e.declared()
	recv := e.backend()
	var lat []time.Duration
	for i, idle := range []time.Duration{50 * time.Millisecond, 200 * time.Millisecond, 450 * time.Millisecond, time.Second, 2 * time.Second} {
		ctx, cancel := context.WithTimeout(context.Background(), e.opts.Wait)
		res := receiveAsync(ctx, recv, e.queue, e.lease)
		time.Sleep(e.scaled(idle))
		e.put(send, time.Time{}, fmt.Sprintf("wake-%d", i))
		sent := time.Now()
		r := <-res
		cancel()
		if r.err != nil || len(r.ds) != 1 {
			t.Fatalf("a Receive waiting on an empty queue, then given a message: %d deliveries, %v%s", len(r.ds), r.err, e.stallNote())
		}
		e.ack(recv, r.ds...)
		lat = append(lat, max(r.at.Sub(sent), 0))
	}
	sorted := slices.Clone(lat)
	slices.Sort(sorted)
	if bound, judged := e.bound(250*time.Millisecond), sorted[len(sorted)-2]; judged > bound {
		var s []string
		for _, l := range lat {
			s = append(s, l.Round(time.Millisecond).String())
		}
		t.Errorf("a Receive waiting on an empty queue took %s to hand out a message enqueued meanwhile (second slowest %v, bound %v): "+
			"Receive must not sleep on a fixed interval when the broker can signal new work, however long it has waited, and where it must poll, it polls every few tens of milliseconds%s",
			strings.Join(s, ", "), judged.Round(time.Millisecond), bound, e.stallNote())
	}
}

// testNotBeforeOnTime: a Receive waiting on a queue whose only message is
// scheduled hands it out no earlier than its NotBefore and soon after it,
// with no other traffic on the queue to wake it: a message enqueued with a
// NotBefore, then the copy that a Requeue of it schedules (which counts
// its deliveries from the start again).
func testNotBeforeOnTime(t *testing.T, e *env) {
	send := e.declared()
	recv := e.backend()
	due := func() time.Time { return time.Now().Add(e.scaled(400 * time.Millisecond)) }
	first := e.dueOnTime(recv, "enqueued", func() time.Time {
		time.Sleep(e.scaled(100 * time.Millisecond)) // the Receive waits first
		at := due()
		e.put(send, at, "later")
		return at
	})
	if first == nil {
		return
	}
	copyOf := e.dueOnTime(recv, "requeued", func() time.Time {
		at := due()
		ctx := ctxT(t, e.opts.Wait)
		if err := recv.Requeue(ctx, first, driver.Message{ID: e.queue + "-copy", Body: []byte("later again"), NotBefore: at}); err != nil {
			t.Fatalf("Requeue: %v", err)
		}
		return at
	})
	if copyOf == nil {
		return
	}
	if copyOf.Deliveries != 1 || string(copyOf.Body) != "later again" {
		t.Errorf("the copy written by Requeue came with body %q and Deliveries %d, want %q and 1: a Requeue's copy counts its deliveries from the start again",
			copyOf.Body, copyOf.Deliveries, "later again")
	}
	e.ackFresh(recv, copyOf) // just received: a stalled Receive may have spent its lease
}

// dueOnTime starts a Receive, calls schedule (which makes a message due at
// the time it returns) and checks that the Receive hands the message out
// no earlier than then and within e.onTime after. It returns the delivery,
// or nil after reporting a failure.
func (e *env) dueOnTime(recv driver.Backend, what string, schedule func() time.Time) *driver.Delivery {
	t := e.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.Wait+e.onTime())
	defer cancel()
	res := receiveAsync(ctx, recv, e.queue, e.lease)
	due := schedule()
	select {
	case r := <-res:
		if r.err != nil || len(r.ds) != 1 {
			t.Fatalf("Receive waiting for the %s message: %d deliveries, %v", what, len(r.ds), r.err)
		}
		if r.at.Before(due) {
			t.Errorf("the %s message was handed out %v before its NotBefore", what, due.Sub(r.at).Round(time.Millisecond))
		}
		if late := r.at.Sub(due); late > e.onTime() {
			t.Errorf("the %s message was handed out %v after its NotBefore (bound %v)%s", what, late.Round(time.Millisecond), e.onTime(), e.stallNote())
		}
		return r.ds[0]
	case <-time.After(time.Until(due) + e.onTime()):
		t.Errorf("a Receive waiting on a queue whose only message (%s) was due at its NotBefore had not handed it out %v after it: "+
			"a backend wakes for a due NotBefore by itself (a timer, or the broker's own delay), not when other traffic comes by%s",
			what, e.onTime(), e.stallNote())
		return nil
	}
}

// testCancelledReceive: Receives of up to three messages whose ctx ends
// while they are claiming (cancelled at random moments of a round trip)
// either hand their messages out or put every one of them back uncounted.
// Every message then comes, once, with Deliveries 1, and none waits for a
// lease to lapse.
func testCancelledReceive(t *testing.T, e *env) {
	b := e.declared()
	const n, batch = 36, 3
	e.put(b, time.Time{}, bodies("c", n)...)
	seen := map[string]int{}
	lapsed := map[string]bool{} // messages whose Ack came after their lease
	var after time.Time         // when the last phase began
	take := func(b driver.Backend, ds []*driver.Delivery) {
		t.Helper()
		for _, d := range ds {
			seen[string(d.Body)]++
			if d.Deliveries == 1 {
				continue
			}
			if lapsed[string(d.Body)] {
				t.Logf("message %q came again counting Deliveries %d: its lease ran out before its Ack (a stall)", d.Body, d.Deliveries)
				continue
			}
			how := "was put back, counted"
			if !after.IsZero() && time.Since(after) >= e.lease*9/10 {
				how = "was not put back: it came again only when its lease ran out"
			}
			t.Errorf("message %q was handed out counting Deliveries %d after Receives whose ctx ended while they claimed: it %s; "+
				"messages a Receive took but did not hand out must be put back at once, without counting a delivery", d.Body, d.Deliveries, how)
		}
		ctx := ctxT(t, e.opts.Wait)
		for _, d := range ds {
			switch err := b.Ack(ctx, d); {
			case errors.Is(err, driver.ErrLeaseLost):
				// A machine too loaded to ack within a lease: the message
				// comes again, counted, by the rules.
				lapsed[string(d.Body)] = true
			case err != nil:
				t.Errorf("Ack of a live delivery: %v", err)
			}
		}
	}
	// One Receive that is not cancelled times a round trip.
	start := time.Now()
	take(b, e.receiveN(b, 1, e.lease))
	rtt := time.Since(start)
	cancels := 0
	for i := 0; i < 40 && len(seen) < n-2*batch; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan received, 1)
		go func() {
			ds, err := b.Receive(ctx, e.queue, batch, e.lease)
			res <- received{ds, err, time.Now()}
		}()
		// A timer this short fires late (a millisecond or so): spin.
		for at, d := time.Now(), rand.N(3*rtt/2); time.Since(at) < d; {
			runtime.Gosched()
		}
		cancel()
		r := <-res
		if len(r.ds) == 0 && errors.Is(r.err, context.Canceled) {
			cancels++
		} else if r.err != nil && !errors.Is(r.err, context.Canceled) {
			t.Fatalf("Receive: %v", r.err)
		}
		take(b, r.ds)
	}
	// The rest, on a fresh connection: nothing may have been left leased.
	other := e.backend()
	ctx := ctxT(t, e.opts.Wait)
	after = time.Now()
	for len(seen) < n {
		ds, err := other.Receive(ctx, e.queue, n, e.lease)
		take(other, ds)
		if err != nil {
			t.Fatalf("%d of %d messages received, then %v (%d Receives were cancelled)%s", len(seen), n, err, cancels, e.stallNote())
		}
	}
	for body, c := range seen {
		if c > 1 && !lapsed[body] {
			t.Errorf("message %q was handed out %d times, acknowledged each time", body, c)
		}
	}
	t.Logf("%d Receives of up to %d cancelled before they handed out anything, at random within one and a half round trips of %v", cancels, batch, rtt.Round(time.Microsecond))
}

// testNotBeforeRace: a Receive that lands just before a message's
// NotBefore never takes it early. Three receivers call Receive back to
// back, each with a short ctx of its own (10 to 40 ms, at random) until the
// NotBefore, so that calls begin all through the last moments before it,
// on a queue whose only message is scheduled; three rounds. A delivery that a Receive
// returned before the NotBefore was handed out early. (A Receive waiting
// when the NotBefore comes, which Delivery/NotBeforeOnTime times, takes
// another path in most backends: a timer, not a claim racing the clock.)
func testNotBeforeRace(t *testing.T, e *env) {
	send := e.declared()
	recvs := []driver.Backend{e.backend(), e.backend(), e.backend()}
	for round := range 3 {
		nb := time.Now().Add(e.scaled(300 * time.Millisecond))
		e.put(send, nb, fmt.Sprintf("race-%d", round))
		ctx, cancel := context.WithTimeout(context.Background(), time.Until(nb)+e.onTime()+e.opts.Wait)
		type result struct {
			b driver.Backend
			received
		}
		results := make(chan result, len(recvs))
		for _, b := range recvs {
			go func() {
				for ctx.Err() == nil {
					wait := e.opts.Wait // once the NotBefore has passed, a Receive waits as usual
					if time.Now().Before(nb) {
						wait = time.Duration(10+rand.IntN(31)) * time.Millisecond
					}
					rctx, rcancel := context.WithTimeout(ctx, wait)
					ds, err := b.Receive(rctx, e.queue, 1, e.lease)
					at := time.Now()
					rcancel()
					if len(ds) > 0 || err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
						results <- result{b, received{ds, err, at}}
						return
					}
				}
				results <- result{}
			}()
		}
		n := 0
		for range recvs {
			r := <-results
			if len(r.ds) > 0 || r.err != nil {
				cancel() // the others stop
			}
			if r.err != nil {
				t.Errorf("round %d: Receive: %v", round, r.err)
			}
			if len(r.ds) == 0 {
				continue
			}
			n += len(r.ds)
			e.ack(r.b, r.ds...)
			if r.at.Before(nb) {
				t.Errorf("round %d: a message scheduled for %s was handed out %v before its NotBefore, to a Receive racing it: a message is never delivered before its NotBefore",
					round, nb.Format(time.StampMilli), nb.Sub(r.at).Round(time.Microsecond))
			}
		}
		cancel()
		if n != 1 {
			t.Fatalf("round %d: %d deliveries of the one scheduled message, want 1%s", round, n, e.stallNote())
		}
	}
}
