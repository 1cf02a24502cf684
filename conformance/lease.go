package conformance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// slowRounds bounds how often Lease/ExtendedForSlowHandler tries again, each
// time with a lease twice as long, when a failure coincides with a stall of
// the test process (see stallWatch).
const slowRounds = 3

// testLeaseExtension checks that the platform keeps renewing the lease of a
// handler that runs ten leases long, so that the job is not delivered to the
// second worker waiting for it. A renewal needs the process and the broker
// to answer: when a round fails and this process stalled, or the broker
// took, for a quarter of the lease or more during it (a loaded machine or
// emulator, not the backend's logic), the case says so and runs again with
// a lease twice as long, at most slowRounds times in all. The broker's time
// is what the probe's requests took, and what a renewal took: a renewal the
// platform reports unanswered within its bound (a third of the lease, the
// lease keeper's) is a broker stall of that long, even when the probe's
// requests were answered meanwhile (an emulator can leave one request
// waiting for seconds while it answers others). A failure without such a
// stall fails at once.
func testLeaseExtension(t *testing.T, e *env) {
	lease := e.lease
	admin := e.producer()
	for round := 1; ; round++ {
		start := time.Now()
		stopProbe, slowest := probeBroker(admin, e.queue)
		problems, lateRenewal := slowHandlerRound(t, e, lease, round)
		stopProbe()
		if len(problems) == 0 {
			return
		}
		stalled := max(stalls.longest(start), slowest())
		if lateRenewal {
			t.Logf("round %d: a renewal went unanswered for a third of the lease (%v) or more", round, (lease / 3).Round(time.Millisecond))
			stalled = max(stalled, lease/3)
		}
		if stalled < lease/4 || round == slowRounds {
			for _, p := range problems {
				t.Error(p)
			}
			if stalled > 0 {
				t.Logf("round %d of %d, lease %v: the longest stall of this test process or the broker was %v", round, slowRounds, lease, stalled.Round(time.Millisecond))
			}
			return
		}
		t.Logf("round %d, lease %v: %s; this test process or the broker stalled for up to %v meanwhile (the machine is loaded), so the lease is doubled and the case runs again",
			round, lease, strings.Join(problems, "; "), stalled.Round(time.Millisecond))
		lease *= 2
	}
}

// probeBroker asks the broker for the queue's depths every 100 ms until
// stop is called; slowest returns the longest answer (or wait for one)
// seen.
func probeBroker(p *ap.Platform, queue string) (stop func(), slowest func() time.Duration) {
	var longest atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			t0 := time.Now()
			_, _ = p.Stats(ctx, queue)
			if d := int64(time.Since(t0)); d > longest.Load() && ctx.Err() == nil {
				longest.Store(d)
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() { cancel(); <-done }, func() time.Duration { return time.Duration(longest.Load()) }
}

// renewalWatch is the log handler of a round's workers: it notes a lease
// renewal the platform reports unanswered within its bound (a warning about
// extending a lease whose error is context.DeadlineExceeded).
type renewalWatch struct{ late atomic.Bool }

func (w *renewalWatch) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (w *renewalWatch) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "extend") {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && errors.Is(err, context.DeadlineExceeded) {
			w.late.Store(true)
			return false
		}
		return true
	})
	return nil
}

func (w *renewalWatch) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *renewalWatch) WithGroup(string) slog.Handler      { return w }

// slowHandlerRound runs one round and returns what went wrong, and whether
// a renewal went unanswered within the platform's bound.
func slowHandlerRound(t *testing.T, e *env, lease time.Duration, round int) (problems []string, lateRenewal bool) {
	hold := 10 * lease
	slow := func(ctx context.Context, _ *ap.Job) error {
		select {
		case <-time.After(hold):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	jobType := fmt.Sprintf("slow%d", round)
	job := &ap.Job{Type: jobType}
	e.enqueue(e.producer(), job)
	cfg := e.config()
	cfg.Lease = lease
	renewals := &renewalWatch{}
	cfg.Logger = slog.New(renewals)
	var ws []*worker
	for range 2 { // two workers compete for it
		w := e.worker(cfg).handle(t, jobType, slow)
		for r := 1; r < round; r++ {
			w.handle(t, fmt.Sprintf("slow%d", r), ok)
		}
		ws = append(ws, w.start(t))
	}
	e.waitLonger(hold, "the slow job to finish", func() bool {
		o := e.rec.outcomes(job.ID)
		return len(o) > 0
	})
	time.Sleep(max(3*lease/2, e.scaled(300*time.Millisecond))) // let a second delivery show itself
	if o := e.rec.outcomes(job.ID); len(o) != 1 || o[0].Outcome != ap.OutcomeSucceeded {
		var got []string
		for _, a := range o {
			got = append(got, string(a.Outcome))
		}
		problems = append(problems, fmt.Sprintf("outcomes %v, want one success", got))
	}
	if n := e.rec.count(job.ID); n != 1 {
		problems = append(problems, fmt.Sprintf("a handler running %v (10 leases) was delivered %d times, want 1", hold, n))
	}
	for _, w := range ws {
		w.stop(t, e.scaled(time.Second)) // a second delivery still running is handed back
	}
	return problems, renewals.late.Load()
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
	d2, got2 := ds[0], time.Now()
	// The live lease runs from the claim, which a slow Receive may have
	// made long before it returned: renew it, so the stale calls below
	// have a whole lease to run in.
	if err := b2.Extend(ctx, d2, e.lease); errors.Is(err, driver.ErrLeaseLost) {
		t.Logf("the second delivery's lease ran out before its Receive returned%s: the stale receipts are not judged", e.stallNote())
		return
	} else if err != nil {
		t.Fatalf("Extend of the live delivery: %v", err)
	}
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
	err = b2.Ack(ctx, d2)
	if took := time.Since(got2); errors.Is(err, driver.ErrLeaseLost) && took >= e.lease*9/10 {
		// The four stale calls took the live delivery's whole lease (a
		// stalled broker or test process): its Ack cannot be judged.
		t.Logf("the live delivery's Ack came %v after its Receive, past %v of its %v lease: %v; not judged%s", took.Round(time.Millisecond), e.lease*9/10, e.lease, err, e.stallNote())
		return
	}
	if err != nil {
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

// testLapsesOnTime: a delivery that is never settled comes back to a
// Receive already waiting for it once its lease runs out (not before, and
// soon after), with one more delivery counted; with a Disconnecter, once
// its connection is cut.
func testLapsesOnTime(t *testing.T, e *env) {
	b1 := e.declared()
	b2 := e.backend()
	e.put(b1, time.Time{}, "lapse")
	start := time.Now()
	d1 := e.receiveN(b1, 1, e.lease)[0]
	got := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.Wait+e.lease+e.onTime())
	defer cancel()
	res := receiveAsync(ctx, b2, e.queue, e.lease)
	from, what := got.Add(e.lease), fmt.Sprintf("its lease of %v ran out", e.lease)
	dis, cut := e.h.(Disconnecter)
	if cut {
		if err := dis.Disconnect(ctx, b1); err != nil {
			t.Fatalf("Disconnect: %v", err)
		}
		from, what = time.Now(), "its connection was cut"
	}
	select {
	case r := <-res:
		if r.err != nil || len(r.ds) != 1 {
			t.Fatalf("Receive waiting for a lapsed delivery: %d deliveries, %v", len(r.ds), r.err)
		}
		e.ackFresh(b2, r.ds[0])
		if d := r.ds[0]; d.Deliveries != d1.Deliveries+1 {
			t.Errorf("a delivery whose lease lapsed came again counting Deliveries %d, want %d (one more)", d.Deliveries, d1.Deliveries+1)
		}
		if early := start.Add(e.lease - 5*time.Millisecond); !cut && r.at.Before(early) {
			t.Errorf("a delivery came again %v after Receive was called, before its lease of %v could run out", r.at.Sub(start).Round(time.Millisecond), e.lease)
		}
		if late := r.at.Sub(from); late > e.onTime() {
			t.Errorf("a delivery came again %v after %s (bound %v)%s", late.Round(time.Millisecond), what, e.onTime(), e.stallNote())
		}
	case <-time.After(time.Until(from) + e.onTime()):
		t.Errorf("a Receive waiting on a queue whose only message's lease had lapsed had not handed it out %v after %s: "+
			"a lapsed lease makes the message deliverable again by itself (a timer, or the broker's own), not when other traffic comes by%s",
			e.onTime(), what, e.stallNote())
	}
}

// testLapsedReceipt: once a lease has run out, the old receipt's Ack,
// Extend, Requeue and DeadLetter are refused with ErrLeaseLost, even though
// no other worker has taken the job yet, and change nothing.
func testLapsedReceipt(t *testing.T, e *env) {
	b1 := e.declared()
	e.put(b1, time.Time{}, bodies("lapsed", 4)...)
	ds := e.receiveN(b1, 4, e.lease)
	got := time.Now()
	ctx := ctxT(t, e.opts.Wait)
	why := "after its lease had run out, before any other Receive"
	if dis, ok := e.h.(Disconnecter); ok {
		if err := dis.Disconnect(ctx, b1); err != nil {
			t.Fatalf("Disconnect: %v", err)
		}
		// An ack written into a connection that is being cut is lost, as
		// at-least-once allows: give the backend a moment to see the cut.
		time.Sleep(e.scaled(250 * time.Millisecond))
		why = fmt.Sprintf("%v after its connection was cut, before any other Receive", e.scaled(250*time.Millisecond))
	} else {
		time.Sleep(time.Until(got.Add(e.lease + max(e.lease/4, e.scaled(100*time.Millisecond)))))
	}
	leaseLost(t, "Ack", b1.Ack(ctx, ds[0]), why)
	leaseLost(t, "Extend", b1.Extend(ctx, ds[1], e.lease), why)
	leaseLost(t, "Requeue", b1.Requeue(ctx, ds[2], driver.Message{ID: e.queue + "-copy", Body: []byte("a new copy")}), why)
	leaseLost(t, "DeadLetter", b1.DeadLetter(ctx, ds[3], driver.DeadMessage{ID: e.queue + "-rec", Body: []byte("a record")}), why)
	// Nothing was acted on: the four come back, each counted once more.
	b2 := e.backend()
	again := e.receiveWithin(b2, 4, e.lease, e.onTime())
	e.ack(b2, again...)
	if len(again) != 4 {
		t.Errorf("%d of the 4 messages came again: a refused settle must change nothing", len(again))
	}
	for _, d := range again {
		if d.Deliveries != 2 {
			t.Errorf("message %q came again counting Deliveries %d, want 2: a refused settle must change nothing", d.Body, d.Deliveries)
		}
	}
	if dead := e.listDead(b2); len(dead) > 0 {
		t.Errorf("the refused DeadLetter wrote records %q", dead)
	}
}

// testExtendLate: an Extend that comes in the last tenth of the lease
// renews it, or says it cannot: it never returns nil without renewing. The
// platform extends a third of the way in, so this case calls the backend
// directly: it receives a message and extends it when at most 7% of the
// lease is left (93% of it after the Receive was called, the claim having
// come after), for another lease (as the platform does: NATS cannot grant
// more than the lease Receive was given). When the Extend returns nil,
// just past the end of the first lease another Receive must not get the
// message and its Ack must succeed. A backend that stops acting on a delivery near the end of
// its lease (NATS's guard against an ack crossing the redelivery) may
// answer ErrLeaseLost instead: the message must then come back. A check
// that came too late to judge (this process or the broker stalled) runs
// the round again with a lease twice as long, at most slowRounds times.
func testExtendLate(t *testing.T, e *env) {
	b1 := e.declared()
	b2 := e.backend()
	lease := e.lease
	for round := 1; ; round++ {
		judged, why := extendLateRound(t, e, b1, b2, lease, round)
		if judged || t.Failed() {
			return
		}
		if round == slowRounds {
			t.Fatalf("round %d of %d: %s: a late Extend could not be judged%s", round, slowRounds, why, e.stallNote())
		}
		t.Logf("round %d, lease %v: %s%s; again with a lease twice as long", round, lease, why, e.stallNote())
		lease *= 2
	}
}

// extendLateRound is one round of Lease/ExtendLate. It reports whether the
// round judged the backend, and if not why.
func extendLateRound(t *testing.T, e *env, b1, b2 driver.Backend, lease time.Duration, round int) (judged bool, why string) {
	e.put(b1, time.Time{}, fmt.Sprintf("late-%d", round))
	ctx := ctxT(t, e.opts.Wait+4*lease)
	start := time.Now()
	d := e.receiveN(b1, 1, lease)[0]
	got := time.Now()
	time.Sleep(time.Until(start.Add(lease * 93 / 100)))
	at := time.Now()
	err := b1.Extend(ctx, d, lease)
	if errors.Is(err, driver.ErrLeaseLost) {
		// Refused: the lease is over for the backend, so the message
		// comes back.
		t.Logf("round %d: the Extend %v after the Receive began (lease %v) was refused with ErrLeaseLost; the message must come back", round, at.Sub(start).Round(time.Millisecond), lease)
		e.ackFresh(b2, e.receiveN(b2, 1, lease)[0])
		return true, ""
	}
	if err != nil {
		t.Fatalf("Extend in the last tenth of the lease: %v", err)
	}
	// Just past the end of the first lease, within the renewed one.
	time.Sleep(time.Until(got.Add(lease + lease/8)))
	again := e.receiveWithin(b2, 1, lease, lease/8)
	err = b1.Ack(ctx, d)
	if late := time.Since(at); late > lease*3/4 {
		// A backend may stop acting on a delivery in the last part of
		// its lease (NATS: the last fifth): too late to judge.
		e.ack(b2, again...)
		return false, fmt.Sprintf("the check came %v after the Extend, too near the end of the renewed lease of %v (the Receive took %v)",
			late.Round(time.Millisecond), lease, got.Sub(start).Round(time.Millisecond))
	}
	if len(again) > 0 {
		t.Errorf("a delivery whose lease (%v) was extended in its last tenth (%v after the Receive began; the Extend returned nil) was handed out again when the first lease ran out: "+
			"Extend renews the lease however late in it it comes, or returns ErrLeaseLost", lease, at.Sub(start).Round(time.Millisecond))
		e.ack(b2, again...)
	}
	if err != nil {
		t.Errorf("Ack after a late Extend that returned nil, past the end of the first lease and within the renewed one: %v; Extend renews the lease however late in it it comes, or returns ErrLeaseLost", err)
	}
	return true, ""
}

// testHeldWholeBatch: every delivery of a batch is held for the lease
// Receive was given, not only the first. One Receive takes three messages;
// another backend's Receive, ending at eight tenths of the lease, must get
// none of them. A Receive that returned a message after the lease could
// have run out (a stall) is not judged.
func testHeldWholeBatch(t *testing.T, e *env) {
	b1 := e.declared()
	b2 := e.backend()
	e.put(b1, time.Time{}, bodies("batch", 3)...)
	start := time.Now()
	ds := e.receiveN(b1, 3, e.lease)
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(e.lease*8/10))
	defer cancel()
	stolen, err := b2.Receive(ctx, e.queue, 3, e.lease)
	at := time.Now()
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive of another backend: %v", err)
	}
	e.ack(b2, stolen...)
	if len(stolen) > 0 && at.Before(start.Add(e.lease)) {
		var got []string
		for _, d := range stolen {
			got = append(got, string(d.Body))
		}
		t.Errorf("another backend received %q %v after a Receive of three under a lease of %v began: every delivery of a batch is held for the lease Receive was given",
			got, at.Sub(start).Round(time.Millisecond), e.lease)
	}
	// The batch is acknowledged under a ctx of its own: ctx ended with the
	// other backend's Receive. A lapsed one (a stall) is refused; that is
	// not this case's rule, but any other error is.
	actx := ctxT(t, e.opts.Wait)
	for _, d := range ds {
		if err := b1.Ack(actx, d); err != nil && !errors.Is(err, driver.ErrLeaseLost) {
			t.Errorf("Ack of a delivery of the batch: %v", err)
		}
	}
}

// testSettlesRedelivered: a delivery that came again (its backend closed
// without settling it) is settled by DeadLetter like a first one: the
// message does not come back, and the record is written once.
func testSettlesRedelivered(t *testing.T, e *env) {
	b1 := e.declared()
	b2 := e.backend()
	e.put(b1, time.Time{}, "again")
	e.receiveN(b1, 1, e.lease)
	if err := b1.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	lapsed := 0 // DeadLetters refused for a lease that ran out first
	for round := 1; ; round++ {
		d := e.receiveWithin(b2, 1, e.lease, e.opts.Wait+e.lease+e.onTime())
		if len(d) != 1 && round > 1 {
			t.Fatalf("after a DeadLetter refused with ErrLeaseLost the message did not come again within %v: a refused DeadLetter changes nothing", e.opts.Wait+e.lease+e.onTime())
		}
		if len(d) != 1 {
			t.Fatalf("a delivery abandoned by Close did not come again within %v", e.opts.Wait+e.lease+e.onTime())
		}
		if d[0].Deliveries < 2 {
			t.Errorf("a delivery abandoned by Close came again counting Deliveries %d, want 2", d[0].Deliveries)
		}
		ctx := ctxT(t, e.opts.Wait)
		err := b2.DeadLetter(ctx, d[0], driver.DeadMessage{ID: e.queue + "-rec", Body: []byte("a record")})
		if errors.Is(err, driver.ErrLeaseLost) && round < slowRounds {
			// The delivery's lease ran out before DeadLetter could act (a
			// loaded machine, a slow store): not this case's rule. The
			// message comes again, redelivered still.
			t.Logf("round %d: DeadLetter of a redelivered message: %v%s; again", round, err, e.stallNote())
			lapsed++
			continue
		}
		if err != nil {
			t.Fatalf("DeadLetter of a redelivered message: %v", err)
		}
		break
	}
	if back := e.receiveWithin(b2, 1, e.lease, e.lease+e.onTime()); len(back) > 0 {
		e.ack(b2, back...)
		t.Errorf("a redelivered message dead-lettered with DeadLetter came back %d deliveries on (body %q): DeadLetter settles the delivery, a redelivered one too", back[0].Deliveries, back[0].Body)
	}
	// A DeadLetter that found its lease lost after its record was written
	// leaves that record (a duplicate, never a loss).
	if dead := e.listDead(b2); len(dead) < 1 || len(dead) > 1+lapsed {
		t.Errorf("the dead-letter queue lists %q, want the one record (and at most one more per DeadLetter refused for a lapsed lease: %d)", dead, lapsed)
	}
}
