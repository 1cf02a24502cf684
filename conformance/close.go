package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// testErrClosed: Close returns nil, twice; a Receive waiting when Close is
// called returns ErrClosed; after Close every method returns ErrClosed,
// those of the optional interfaces too, and none blocks.
func testErrClosed(t *testing.T, e *env) {
	b := e.declared()
	e.put(b, time.Time{}, bodies("closed", 2)...)
	ds := e.receiveN(b, 2, e.opts.Wait)
	ctx := ctxT(t, e.opts.Wait)
	if err := b.DeadLetter(ctx, ds[1], driver.DeadMessage{ID: e.queue + "-rec", Body: []byte("a record")}); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	dd, err := b.NextDead(ctx, e.queue)
	if err != nil {
		t.Fatalf("NextDead: %v", err)
	}
	rctx, cancel := context.WithTimeout(context.Background(), e.opts.Wait)
	defer cancel()
	waiting := receiveAsync(rctx, b, e.queue, e.lease) // the queue is empty now
	time.Sleep(e.scaled(100 * time.Millisecond))
	bound := e.bound(2 * time.Second)
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(bound):
		t.Fatalf("Close had not returned after %v", bound)
	}
	select {
	case r := <-waiting:
		if len(r.ds) > 0 || !errors.Is(r.err, driver.ErrClosed) {
			t.Errorf("a Receive waiting when Close was called returned %d deliveries and %v, want driver.ErrClosed", len(r.ds), r.err)
		}
	case <-time.After(bound):
		t.Errorf("a Receive waiting when Close was called had not returned %v later; Close must end it (with driver.ErrClosed)", bound)
	}
	if err := b.Close(); err != nil {
		t.Errorf("a second Close: %v; Close is idempotent", err)
	}
	calls := []closedCall{
		{"Declare", func(ctx context.Context) error { return b.Declare(ctx, e.queue) }},
		{"Enqueue", func(ctx context.Context) error {
			return b.Enqueue(ctx, e.queue, []driver.Message{{ID: e.queue + "-late", Body: []byte("late")}})
		}},
		{"Receive", func(ctx context.Context) error { _, err := b.Receive(ctx, e.queue, 1, e.lease); return err }},
		{"Ack", func(ctx context.Context) error { return b.Ack(ctx, ds[0]) }},
		{"Extend", func(ctx context.Context) error { return b.Extend(ctx, ds[0], e.lease) }},
		{"Requeue", func(ctx context.Context) error {
			return b.Requeue(ctx, ds[0], driver.Message{ID: e.queue + "-copy", Body: []byte("copy")})
		}},
		{"DeadLetter", func(ctx context.Context) error {
			return b.DeadLetter(ctx, ds[0], driver.DeadMessage{ID: e.queue + "-rec2", Body: []byte("record")})
		}},
		{"NextDead", func(ctx context.Context) error { _, err := b.NextDead(ctx, e.queue); return err }},
		{"SettleDead", func(ctx context.Context) error { return b.SettleDead(ctx, dd, false) }},
		{"ListDead", func(ctx context.Context) error { _, _, err := b.ListDead(ctx, e.queue, "", 10); return err }},
		{"DeleteDead", func(ctx context.Context) error { _, err := b.DeleteDead(ctx, e.queue, []string{dd.ID}); return err }},
		{"PurgeDead", func(ctx context.Context) error { _, err := b.PurgeDead(ctx, e.queue); return err }},
		{"Stats", func(ctx context.Context) error { _, err := b.Stats(ctx, e.queue); return err }},
	}
	if d, ok := b.(driver.QueueDeleter); ok {
		calls = append(calls, closedCall{"DeleteQueue", func(ctx context.Context) error { return d.DeleteQueue(ctx, e.queue) }})
	}
	if r, ok := b.(driver.Releaser); ok {
		// Nothing is buffered after Close: nil says so truthfully.
		calls = append(calls, closedCall{"Release", func(ctx context.Context) error {
			if err := r.Release(ctx, e.queue); err != nil {
				return err
			}
			return driver.ErrClosed
		}})
	}
	if p, ok := b.(driver.Pinger); ok {
		calls = append(calls, closedCall{"Ping", p.Ping})
	}
	for _, c := range calls {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		start := time.Now()
		err := c.call(ctx)
		cancel()
		switch {
		case errors.Is(err, driver.ErrClosed):
		case time.Since(start) >= bound:
			t.Errorf("%s after Close blocked until its ctx ended (%v); it must return driver.ErrClosed at once", c.name, err)
		default:
			t.Errorf("%s after Close: got %v, want driver.ErrClosed", c.name, err)
		}
	}
	caps := make(chan driver.Capabilities, 1)
	go func() { caps <- b.Capabilities() }()
	select {
	case <-caps:
	case <-time.After(bound):
		t.Errorf("Capabilities after Close blocked; it must not")
	}
}

// closedCall is one method called after Close.
type closedCall struct {
	name string
	call func(context.Context) error
}

// testCloseAbandons: every delivery left unsettled by a backend that
// closes comes back, one more delivery counted: at once when the backend
// declares RedeliversOnClose (under a lease far too long to explain it),
// else once its lease runs out. The backend holds two, received together:
// the first back is timed, the second must follow it.
func testCloseAbandons(t *testing.T, e *env) {
	b1 := e.declared()
	b2 := e.backend()
	e.put(b1, time.Time{}, "abandoned", "abandoned-too")
	lease := e.lease
	if e.caps.RedeliversOnClose {
		lease = 4 * e.opts.Wait
	}
	d1 := e.receiveN(b1, 2, lease)[0]
	got := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.Wait+e.lease+e.onTime())
	defer cancel()
	res := receiveAsync(ctx, b2, e.queue, e.lease)
	if err := b1.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	from, what := got.Add(lease), "its lease ran out after its backend closed"
	if e.caps.RedeliversOnClose {
		from, what = time.Now(), "its backend closed (Capabilities.RedeliversOnClose)"
	}
	select {
	case r := <-res:
		if r.err != nil || len(r.ds) != 1 {
			t.Fatalf("Receive waiting for an abandoned delivery: %d deliveries, %v", len(r.ds), r.err)
		}
		e.ack(b2, r.ds...)
		if d := r.ds[0]; d.Deliveries != d1.Deliveries+1 {
			t.Errorf("an abandoned delivery came again counting Deliveries %d, want %d: Close abandons deliveries as a dying process would, one more delivery counted",
				d.Deliveries, d1.Deliveries+1)
		}
		if late := r.at.Sub(from); late > e.onTime() {
			t.Errorf("an abandoned delivery came again %v after %s (bound %v)%s", late.Round(time.Millisecond), what, e.onTime(), e.stallNote())
		}
		// The other comes back too.
		more := e.receiveWithin(b2, 1, e.lease, time.Until(from)+e.onTime())
		e.ack(b2, more...)
		if len(more) == 0 {
			t.Errorf("of the two deliveries the backend held when it closed, only one came back within %v after %s: Close abandons every unsettled delivery, and each comes back%s",
				e.onTime(), what, e.stallNote())
		}
		for _, d := range more {
			if d.Deliveries != d1.Deliveries+1 {
				t.Errorf("the second abandoned delivery came again counting Deliveries %d, want %d", d.Deliveries, d1.Deliveries+1)
			}
		}
	case <-time.After(time.Until(from) + e.onTime()):
		t.Errorf("an unsettled delivery had not come again %v after %s: Close abandons deliveries, which come back (at once with RedeliversOnClose, else after their lease)%s",
			e.onTime(), what, e.stallNote())
	}
}

// testCloseReleasesHolds: a dead letter held with NextDead by a backend
// that closes becomes visible to other callers again.
func testCloseReleasesHolds(t *testing.T, e *env) {
	b0 := e.declared()
	rec := e.makeDeadRaw(b0, 1)[0]
	b1, b2 := e.backend(), e.backend()
	ctx := ctxT(t, 2*e.opts.Wait)
	dd, err := b1.NextDead(ctx, e.queue)
	if err != nil || dd.ID != rec.ID {
		t.Fatalf("NextDead: %v (record %v, want %s)", err, dd, rec.ID)
	}
	if other, err := b2.NextDead(ctx, e.queue); !errors.Is(err, driver.ErrNoDeadLetters) {
		t.Fatalf("NextDead while the only record is held by another caller: got %v, %v; want driver.ErrNoDeadLetters", other, err)
	}
	if err := b1.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	closed := time.Now()
	for {
		dd, err := b2.NextDead(ctx, e.queue)
		if err == nil {
			if dd.ID != rec.ID {
				t.Fatalf("NextDead handed out record %s, want %s", dd.ID, rec.ID)
			}
			if err := b2.SettleDead(ctx, dd, false); err != nil {
				t.Errorf("SettleDead(keep): %v", err)
			}
			t.Logf("the record was visible again %v after its holder closed", time.Since(closed).Round(time.Millisecond))
			return
		}
		if !errors.Is(err, driver.ErrNoDeadLetters) {
			t.Fatalf("NextDead: %v", err)
		}
		if time.Since(closed) > e.opts.Wait {
			t.Fatalf("a dead letter held by a backend that then closed was still hidden %v later: "+
				"the holds of a NextDead caller that closes (or dies) must be released, at once or when a hold timeout shorter than Options.Wait ends", e.opts.Wait)
		}
		time.Sleep(e.scaled(50 * time.Millisecond))
	}
}

// testCloseReleasesEveryHold: Close releases every dead-letter hold of the
// backend that closes, and that of every backend that closes: of four
// records, backend A holds two and backend B one; once A closes, a third
// caller sees A's two again, and once B closes, B's. (A hold that ends when
// a hold timeout shorter than Options.Wait runs out also passes.)
func testCloseReleasesEveryHold(t *testing.T, e *env) {
	b0 := e.declared()
	recs := e.makeDeadRaw(b0, 4)
	bA, bB, bC := e.backend(), e.backend(), e.backend()
	ctx := ctxT(t, 3*e.opts.Wait)
	take := func(b driver.Backend, who string) string {
		t.Helper()
		dd, err := b.NextDead(ctx, e.queue)
		if err != nil {
			t.Fatalf("NextDead of %s, with %d records: %v", who, len(recs), err)
		}
		return dd.ID
	}
	heldByA := []string{take(bA, "A"), take(bA, "A")}
	heldByB := []string{take(bB, "B")}
	var mine []*driver.DeadDelivery // what C holds
	defer func() {
		for _, dd := range mine {
			_ = bC.SettleDead(ctx, dd, false)
		}
	}()
	seen := map[string]bool{}
	visible := func(who string, want []string) {
		t.Helper()
		closed := time.Now()
		for {
			for {
				dd, err := bC.NextDead(ctx, e.queue)
				if errors.Is(err, driver.ErrNoDeadLetters) {
					break
				}
				if err != nil {
					t.Fatalf("NextDead: %v", err)
				}
				seen[dd.ID] = true
				mine = append(mine, dd)
			}
			var missing []string
			for _, id := range want {
				if !seen[id] {
					missing = append(missing, id)
				}
			}
			if len(missing) == 0 {
				t.Logf("the records %s held were visible again %v after it closed", who, time.Since(closed).Round(time.Millisecond))
				return
			}
			if time.Since(closed) > e.opts.Wait {
				t.Fatalf("%d of the %d dead letters held by %s (%v) were still hidden %v after it closed: "+
					"Close releases every hold of the backend that closes (as a dying process's end), at once or when a hold timeout shorter than Options.Wait ends",
					len(missing), len(want), who, missing, e.opts.Wait)
			}
			time.Sleep(e.scaled(50 * time.Millisecond))
		}
	}
	if err := bA.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	visible("backend A (the first holder, two records)", heldByA)
	if err := bB.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	visible("backend B (the second holder)", heldByB)
}
