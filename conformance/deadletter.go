package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

// makeDead dead-letters n jobs (Permanent until they have been dead
// once; they succeed once redriven, which the kept "first life" error line
// shows) and returns the worker and the dead letters in queue order. A
// crash's line in the history does not count: a job whose lease was lost
// under load is still dead-lettered when it runs again.
func (e *env) makeDead(t *testing.T, n int) (*worker, []ap.DeadLetter) {
	t.Helper()
	w := e.worker(e.config()).handle(t, "d", firstLifeHandler)
	for i := range n {
		e.enqueue(w.P, &ap.Job{Type: "d", Payload: []byte(fmt.Sprint(i))})
	}
	w.start(t)
	return w, e.waitDead(w.P, n)
}

// firstLife is the error makeDead's jobs fail with until they are redriven.
const firstLife = "first life"

// firstLifeHandler fails a job Permanent until its error history holds the
// firstLife line, that is until it has been dead once and redriven.
func firstLifeHandler(_ context.Context, j *ap.Job) error {
	if !slices.ContainsFunc(j.Errors, func(l string) bool { return strings.Contains(l, firstLife) }) {
		return ap.Permanent(errors.New(firstLife))
	}
	return nil
}

func testDeadEmpty(t *testing.T, e *env) {
	p := e.producer()
	called := false
	err := p.NextDeadLetter(ctxT(t, e.opts.Wait), e.queue, func(context.Context, ap.DeadLetter) (bool, error) {
		called = true
		return true, nil
	})
	if !errors.Is(err, ap.ErrNoDeadLetters) || called {
		t.Errorf("empty queue: got %v (callback called %v), want ErrNoDeadLetters", err, called)
	}
}

func testDeadPopKeepError(t *testing.T, e *env) {
	w, dls := e.makeDead(t, 3)
	ctx := ctxT(t, e.opts.Wait)
	next := func(pop bool, ret error) (string, error) {
		var id string
		err := w.P.NextDeadLetter(ctx, e.queue, func(_ context.Context, dl ap.DeadLetter) (bool, error) {
			id = dl.Job.ID
			return pop, ret
		})
		return id, err
	}
	if id, err := next(false, nil); err != nil || id != dls[0].Job.ID {
		t.Fatalf("peek: got %s, %v; want the oldest, %s", id, err, dls[0].Job.ID)
	}
	if id, _ := next(false, nil); id != dls[0].Job.ID {
		t.Errorf("after keep, the next call saw %s, want the same record %s", id, dls[0].Job.ID)
	}
	boom := errors.New("admin callback failed")
	if id, err := next(true, boom); !errors.Is(err, boom) || id != dls[0].Job.ID {
		t.Errorf("callback error: got %v, want it returned", err)
	}
	if id, _ := next(false, nil); id != dls[0].Job.ID {
		t.Errorf("after a callback error, the next call saw %s, want the same record %s", id, dls[0].Job.ID)
	}
	if id, err := next(true, nil); err != nil || id != dls[0].Job.ID {
		t.Fatalf("pop: %s, %v", id, err)
	}
	if id, _ := next(false, nil); id != dls[1].Job.ID {
		t.Errorf("after pop, the next call saw %s, want %s", id, dls[1].Job.ID)
	}
	if left := e.dead(w.P); len(left) != 2 {
		t.Errorf("%d dead letters left after one pop, want 2", len(left))
	}
}

func testDeadConcurrent(t *testing.T, e *env) {
	const n, callers = 12, 4
	w, dls := e.makeDead(t, n)
	var (
		mu     sync.Mutex
		held   = map[string]bool{}
		popped = map[string]int{}
		wg     sync.WaitGroup
	)
	deadline := time.Now().Add(e.opts.Wait)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				err := w.P.NextDeadLetter(context.Background(), e.queue, func(_ context.Context, dl ap.DeadLetter) (bool, error) {
					id := dl.Job.ID
					mu.Lock()
					if held[id] {
						t.Errorf("two callers hold dead letter %s at once", id)
					}
					held[id] = true
					mu.Unlock()
					time.Sleep(time.Millisecond)
					pop := rand.IntN(3) != 0 // some callers decline
					mu.Lock()
					delete(held, id)
					if pop {
						popped[id]++
					}
					mu.Unlock()
					return pop, nil
				})
				mu.Lock()
				total := len(popped)
				mu.Unlock()
				switch {
				case total == n:
					return
				case errors.Is(err, ap.ErrNoDeadLetters):
					time.Sleep(5 * time.Millisecond) // the rest are held by others
				case err != nil:
					t.Errorf("NextDeadLetter: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, dl := range dls {
		if popped[dl.Job.ID] != 1 {
			t.Errorf("dead letter %s popped %d times, want once", dl.Job.ID, popped[dl.Job.ID])
		}
	}
	if left := e.dead(w.P); len(left) != 0 {
		t.Errorf("%d dead letters left, want 0", len(left))
	}
}

func testDeadListing(t *testing.T, e *env) {
	w, dls := e.makeDead(t, 5)
	ctx := ctxT(t, e.opts.Wait)
	var paged []string
	pages := 0
	cursors := map[string]bool{}
	for cursor := ""; ; pages++ {
		page, err := w.P.DeadLetters(ctx, e.queue, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Letters) > 2 {
			t.Errorf("page of %d records, limit 2", len(page.Letters))
		}
		for _, dl := range page.Letters {
			paged = append(paged, dl.Job.ID)
		}
		if cursor = page.Next; cursor == "" {
			break
		}
		e.cursorAdvances(cursors, cursor)
	}
	if len(paged) != 5 {
		t.Fatalf("paging found %d records, want 5", len(paged))
	}
	for i, dl := range dls {
		if paged[i] != dl.Job.ID {
			t.Errorf("record %d: paged %s, listed %s", i, paged[i], dl.Job.ID)
		}
	}
	again := e.dead(w.P)
	if len(again) != 5 {
		t.Fatalf("after listing the queue holds %d, want 5", len(again))
	}
	for i := range again {
		if again[i].Job.ID != dls[i].Job.ID {
			t.Errorf("listing changed the order at %d: %s, was %s", i, again[i].Job.ID, dls[i].Job.ID)
		}
	}
	var first string
	_ = w.P.NextDeadLetter(ctx, e.queue, func(_ context.Context, dl ap.DeadLetter) (bool, error) {
		first = dl.Job.ID
		return false, nil
	})
	if first != dls[0].Job.ID {
		t.Errorf("after listing NextDeadLetter sees %s, want the oldest %s", first, dls[0].Job.ID)
	}
}

func testRedrive(t *testing.T, e *env) {
	w, dls := e.makeDead(t, 3)
	ctx := ctxT(t, e.opts.Wait)
	n, err := w.P.Redrive(ctx, e.queue, dls[0].Job.ID)
	if err != nil || n != 1 {
		t.Fatalf("Redrive one: %d, %v", n, err)
	}
	e.waitFor("the redriven job to run", func() bool {
		o := e.rec.outcomes(dls[0].Job.ID)
		return len(o) == 2 && o[1].Outcome == ap.OutcomeSucceeded
	})
	a := e.rec.of(dls[0].Job.ID)[1]
	if a.TryCount != 1 || a.Failures != 0 || a.Crashes != 0 || len(a.Job.Errors) != 1 {
		t.Errorf("redriven job: TryCount/Failures/Crashes %d/%d/%d with %d error lines; want 1/0/0 with 1 kept", a.TryCount, a.Failures, a.Crashes, len(a.Job.Errors))
	}
	if left := e.dead(w.P); len(left) != 2 {
		t.Errorf("%d dead letters after redriving one, want 2", len(left))
	}
	if n, err := w.P.Redrive(ctx, e.queue); err != nil || n != 2 {
		t.Fatalf("Redrive all: %d, %v", n, err)
	}
	for _, dl := range dls[1:] {
		e.waitFor("every redriven job to run", func() bool { return e.rec.count(dl.Job.ID) == 2 })
	}
	if left := e.dead(w.P); len(left) != 0 {
		t.Errorf("%d dead letters after redriving all, want 0", len(left))
	}
}

func testPurge(t *testing.T, e *env) {
	w, _ := e.makeDead(t, 3)
	ctx := ctxT(t, e.opts.Wait)
	n, err := w.P.PurgeDeadLetters(ctx, e.queue)
	if err != nil || n != 3 {
		t.Fatalf("Purge: %d, %v; want 3", n, err)
	}
	if left := e.dead(w.P); len(left) != 0 {
		t.Errorf("%d dead letters after purge", len(left))
	}
	err = w.P.NextDeadLetter(ctx, e.queue, func(context.Context, ap.DeadLetter) (bool, error) { return false, nil })
	if !errors.Is(err, ap.ErrNoDeadLetters) {
		t.Errorf("NextDeadLetter after purge: %v", err)
	}
}

// testDeleteLeavesHeld: DeleteDead removes the records it names, except
// one that another caller holds with NextDead, which it neither removes nor
// counts; the holder can still settle it.
func testDeleteLeavesHeld(t *testing.T, e *env) {
	b0 := e.declared()
	recs := e.makeDeadRaw(b0, 3)
	b1 := e.backend()
	ctx := ctxT(t, e.opts.Wait)
	dd, err := b1.NextDead(ctx, e.queue)
	if err != nil || dd.ID != recs[0].ID {
		t.Fatalf("NextDead: %v (record %v, want the oldest, %s)", err, dd, recs[0].ID)
	}
	n, err := b0.DeleteDead(ctx, e.queue, []string{recs[0].ID, recs[1].ID})
	if err != nil {
		t.Fatalf("DeleteDead: %v", err)
	}
	if n != 1 {
		t.Errorf("DeleteDead of a held record and a free one returned %d, want 1: records held by a NextDead caller are left alone and not counted", n)
	}
	if err := b1.SettleDead(ctx, dd, false); err != nil {
		t.Errorf("the holder's SettleDead(keep) after DeleteDead named its record: %v; DeleteDead must have left it alone", err)
	}
	if left, want := e.listDead(b0), []string{recs[0].ID, recs[2].ID}; !sameSet(left, want) {
		t.Errorf("after DeleteDead of %s (held) and %s, the dead-letter queue lists %q, want %q", recs[0].ID, recs[1].ID, left, want)
	}
	if n, err := b0.DeleteDead(ctx, e.queue, []string{recs[1].ID, e.queue + "-never"}); err != nil || n != 0 {
		t.Errorf("DeleteDead of a record deleted already and of an ID never written: %d, %v; want 0: DeleteDead counts the records it removed, not the IDs it was given", n, err)
	}
}

// testHeldForSlowCallback: a NextDeadLetter callback that runs longer than
// the backend's hold (Capabilities.DeadHold) keeps its record, because the
// platform renews the hold with ExtendDead meanwhile: another caller's
// NextDead finds nothing, DeleteDead leaves the record alone, and the pop
// removes it.
func testHeldForSlowCallback(t *testing.T, e *env) {
	b0 := e.declared()
	rec := e.makeDeadRaw(b0, 1)[0]
	slow := 3 * e.caps.DeadHold / 2
	if slow == 0 { // holds that never lapse: they must hold all the same
		slow = e.lease
	}
	p, other := e.producer(), e.backend()
	ctx := ctxT(t, slow+2*e.opts.Wait)
	called := false
	err := p.NextDeadLetter(ctx, e.queue, func(ctx context.Context, dl ap.DeadLetter) (bool, error) {
		called = true
		if dl.ID != rec.ID {
			t.Errorf("NextDeadLetter handed out record %s, want %s", dl.ID, rec.ID)
		}
		time.Sleep(slow)
		if dd, err := other.NextDead(ctx, e.queue); !errors.Is(err, driver.ErrNoDeadLetters) {
			if err == nil {
				_ = other.SettleDead(ctx, dd, false)
			}
			t.Errorf("another caller's NextDead while a NextDeadLetter callback had held the record for %v (Capabilities.DeadHold %v): got %v, %v; "+
				"want driver.ErrNoDeadLetters: a hold renewed with ExtendDead every third of DeadHold must last%s", slow, e.caps.DeadHold, dd, err, e.stallNote())
		}
		if n, err := other.DeleteDead(ctx, e.queue, []string{rec.ID}); err != nil || n != 0 {
			t.Errorf("DeleteDead of the record a slow NextDeadLetter callback holds: %d, %v; want 0: it is still held%s", n, err, e.stallNote())
		}
		return true, nil
	})
	if err != nil || !called {
		t.Errorf("NextDeadLetter popping after a callback of %v: %v (callback called: %v); want nil: the hold must still be the caller's%s", slow, err, called, e.stallNote())
	}
	if left := e.listDead(b0); len(left) != 0 {
		t.Errorf("after the pop the dead-letter queue lists %q, want nothing", left)
	}
}

// testExtendDeadLate: an ExtendDead that comes in the last tenth of a hold
// renews it, or says it cannot: it never returns nil without renewing. The
// platform renews a third of the way in, so this case calls the backend
// directly: it takes a record with NextDead and renews the hold when at
// most 7% of Capabilities.DeadHold is left. When ExtendDead returns nil,
// past the end of the first hold another caller must not get the record
// and SettleDead must succeed; when it returns ErrLeaseLost (a backend that
// stops acting on a hold near its end), the record must be visible again
// within Options.Wait. A backend whose holds last until SettleDead
// (DeadHold zero) has only to keep the record held for a lease. A check
// too late to judge (a stall) runs the round again, at most slowRounds
// times.
func testExtendDeadLate(t *testing.T, e *env) {
	b0 := e.declared()
	e.makeDeadRaw(b0, 1)
	b1, b2 := e.backend(), e.backend()
	hold := e.caps.DeadHold
	if hold == 0 {
		hold = e.lease // holds last until SettleDead: wait a lease
	}
	for round := 1; ; round++ {
		judged, why := extendDeadLateRound(t, e, b1, b2, hold, round)
		if judged || t.Failed() {
			return
		}
		if round == slowRounds {
			t.Fatalf("round %d of %d: %s: a late ExtendDead could not be judged%s", round, slowRounds, why, e.stallNote())
		}
		t.Logf("round %d: %s%s; again", round, why, e.stallNote())
	}
}

func extendDeadLateRound(t *testing.T, e *env, b1, b2 driver.Backend, hold time.Duration, round int) (judged bool, why string) {
	ctx := ctxT(t, e.opts.Wait+4*hold)
	start := time.Now()
	dd, err := b1.NextDead(ctx, e.queue)
	if err != nil {
		t.Fatalf("NextDead: %v", err)
	}
	got := time.Now()
	time.Sleep(time.Until(start.Add(hold * 93 / 100)))
	at := time.Now()
	err = b1.ExtendDead(ctx, dd)
	if errors.Is(err, driver.ErrLeaseLost) {
		t.Logf("round %d: the ExtendDead %v after NextDead began (hold %v) was refused with ErrLeaseLost; the record must be visible again", round, at.Sub(start).Round(time.Millisecond), hold)
		for {
			other, err := b2.NextDead(ctx, e.queue)
			if err == nil {
				if err := b2.SettleDead(ctx, other, false); err != nil {
					t.Errorf("SettleDead(keep): %v", err)
				}
				return true, ""
			}
			if !errors.Is(err, driver.ErrNoDeadLetters) {
				t.Fatalf("NextDead: %v", err)
			}
			if time.Since(at) > e.opts.Wait+hold {
				t.Fatalf("a dead letter whose late ExtendDead was refused with ErrLeaseLost was still hidden %v later: a hold the backend reports lost ends", e.opts.Wait+hold)
			}
			time.Sleep(e.scaled(50 * time.Millisecond))
		}
	}
	if err != nil {
		t.Fatalf("ExtendDead in the last tenth of the hold: %v", err)
	}
	time.Sleep(time.Until(got.Add(hold + hold/8)))
	other, err := b2.NextDead(ctx, e.queue)
	switch {
	case err == nil:
		_ = b2.SettleDead(ctx, other, false)
	case !errors.Is(err, driver.ErrNoDeadLetters):
		t.Fatalf("NextDead of another caller: %v", err)
	}
	settled := b1.SettleDead(ctx, dd, false)
	if late := time.Since(at); e.caps.DeadHold > 0 && late > hold*3/4 {
		return false, fmt.Sprintf("the check came %v after the ExtendDead, too near the end of the renewed hold of %v", late.Round(time.Millisecond), hold)
	}
	if other != nil {
		t.Errorf("a dead letter whose hold (%v) was renewed in its last tenth (%v after NextDead began; ExtendDead returned nil) was handed to another caller when the first hold ran out: "+
			"ExtendDead renews the hold however late in it it comes, or returns ErrLeaseLost", hold, at.Sub(start).Round(time.Millisecond))
	}
	if settled != nil {
		t.Errorf("SettleDead after a late ExtendDead that returned nil, past the end of the first hold and within the renewed one: %v", settled)
	} else if left := e.listDead(b1); len(left) != 1 {
		t.Errorf("after SettleDead(keep) of a record whose hold ExtendDead renewed, the dead-letter queue lists %q, want the one record: SettleDead(keep) leaves the record", left)
	}
	return true, ""
}

// testOldestFreeFirst: while one caller holds the oldest record, another
// caller's NextDead hands out the oldest record nobody holds: the second
// oldest, not any other.
func testOldestFreeFirst(t *testing.T, e *env) {
	b0 := e.declared()
	recs := e.makeDeadRaw(b0, 4)
	b1, b2 := e.backend(), e.backend()
	ctx := ctxT(t, e.opts.Wait)
	first, err := b1.NextDead(ctx, e.queue)
	if err != nil || first.ID != recs[0].ID {
		t.Fatalf("NextDead: %v (record %v, want the oldest, %s)", err, first, recs[0].ID)
	}
	second, err := b2.NextDead(ctx, e.queue)
	if err != nil {
		t.Fatalf("NextDead of a second caller while the first holds the oldest record: %v", err)
	}
	if second.ID != recs[1].ID {
		t.Errorf("while one caller held the oldest record, another caller's NextDead handed out %s, want the oldest free one, %s: NextDead hands out the oldest record no other caller holds", second.ID, recs[1].ID)
	}
	for _, h := range []struct {
		b  driver.Backend
		dd *driver.DeadDelivery
	}{{b1, first}, {b2, second}} {
		if err := h.b.SettleDead(ctx, h.dd, false); err != nil {
			t.Errorf("SettleDead(keep): %v", err)
		}
	}
}

// testHeldForDeadHold: a record handed out by NextDead stays hidden from
// other callers for the whole of Capabilities.DeadHold, with no ExtendDead
// (the platform renews a third of the way in, so this case calls the
// backend directly). Another caller looks at nine tenths of the hold;
// only a look that ended before the hold could have lapsed is judged (a
// look that came late, on a loaded machine, runs the round again, at most
// slowRounds times). A backend whose holds last until SettleDead (DeadHold
// zero) is judged over a lease.
func testHeldForDeadHold(t *testing.T, e *env) {
	b0 := e.declared()
	rec := e.makeDeadRaw(b0, 1)[0]
	b1, b2 := e.backend(), e.backend()
	hold := e.caps.DeadHold
	if hold == 0 {
		hold = e.lease
	}
	ctx := ctxT(t, slowRounds*(2*hold+e.opts.Wait))
	for round := 1; ; round++ {
		start := time.Now()
		dd, err := b1.NextDead(ctx, e.queue)
		got := time.Now() // the hold began before this
		if err != nil || dd.ID != rec.ID {
			t.Fatalf("round %d: NextDead: %v (record %v, want %s)", round, err, dd, rec.ID)
		}
		time.Sleep(time.Until(start.Add(hold * 9 / 10)))
		other, err := b2.NextDead(ctx, e.queue)
		looked := time.Now()
		switch {
		case err == nil:
			_ = b2.SettleDead(ctx, other, false)
		case !errors.Is(err, driver.ErrNoDeadLetters):
			t.Fatalf("round %d: NextDead of another caller: %v", round, err)
		}
		if looked.Before(start.Add(hold)) {
			if other != nil {
				t.Errorf("a dead letter handed out by NextDead %v before was handed to another caller, with Capabilities.DeadHold %v: "+
					"a record stays held for the whole of DeadHold", looked.Sub(start).Round(time.Millisecond), hold)
			} else {
				// A backend may refuse a settle this near the end of a hold
				// (NATS stops acting on one in its last fifth): not this
				// case's rule.
				_ = b1.SettleDead(ctx, dd, false)
			}
			return
		}
		if other == nil && b1.SettleDead(ctx, dd, false) != nil {
			// The settle that frees the record for the next round was
			// refused, this near or past the hold's end (NATS acts on none
			// in its last fifth): the record stays held until the hold
			// runs out where the backend counts it, which began before
			// NextDead returned, so the next round waits that out.
			time.Sleep(time.Until(got.Add(hold + hold/4)))
		}
		if round == slowRounds {
			t.Fatalf("round %d of %d: the other caller's look ended %v after NextDead began, past the hold of %v: could not be judged%s", round, slowRounds, looked.Sub(start).Round(time.Millisecond), hold, e.stallNote())
		}
		t.Logf("round %d: the look ended %v after NextDead began, past the hold of %v%s; again", round, looked.Sub(start).Round(time.Millisecond), hold, e.stallNote())
	}
}
