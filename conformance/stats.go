package conformance

import (
	"fmt"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// testStatsDepths: Stats counts what the queue holds (ready, scheduled, in
// flight, dead), each figure exact or -1 when the backend cannot tell it.
func testStatsDepths(t *testing.T, e *env) {
	b := e.declared()
	e.put(b, time.Time{}, bodies("ready", 4)...)
	e.put(b, time.Now().Add(10*time.Minute), bodies("scheduled", 2)...)
	// One dead letter, written by a backend that then closes (so that
	// nothing it may have taken from the broker ahead stays with it).
	bA := e.backend()
	ctx := ctxT(t, e.opts.Wait)
	if err := bA.DeadLetter(ctx, e.receiveN(bA, 1, e.opts.Wait)[0], driver.DeadMessage{ID: e.queue + "-rec", Body: []byte("a record")}); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	if err := bA.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// One delivery held, under a lease that outlasts the case.
	e.receiveN(e.backend(), 1, 4*e.opts.Wait)
	want := driver.Stats{Ready: 2, Scheduled: 2, InFlight: 1, Dead: 1}
	match := func(st driver.Stats) bool {
		for _, f := range [][2]int64{{st.Ready, want.Ready}, {st.Scheduled, want.Scheduled}, {st.InFlight, want.InFlight}, {st.Dead, want.Dead}} {
			if f[0] != f[1] && f[0] != -1 {
				return false
			}
		}
		return true
	}
	var st driver.Stats
	var err error
	deadline := time.Now().Add(e.bound(5 * time.Second))
	for {
		st, err = b.Stats(ctx, e.queue)
		if err != nil {
			t.Fatalf("Stats: %v", err)
		}
		if match(st) || time.Now().After(deadline) {
			break
		}
		time.Sleep(e.scaled(50 * time.Millisecond))
	}
	if !match(st) {
		t.Errorf("Stats = %s, want %s (or -1 for a figure the backend cannot tell): a queue holding 2 ready messages, 2 scheduled 10 minutes ahead, 1 delivery held and 1 dead letter",
			fmtStats(st), fmtStats(want))
	}
	var unknown []string
	for name, f := range map[string]int64{"Ready": st.Ready, "Scheduled": st.Scheduled, "InFlight": st.InFlight, "Dead": st.Dead} {
		if f == -1 {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) > 0 {
		t.Logf("the backend cannot tell %v (-1)", unknown)
	}
}

func fmtStats(st driver.Stats) string {
	return fmt.Sprintf("Ready %d, Scheduled %d, InFlight %d, Dead %d", st.Ready, st.Scheduled, st.InFlight, st.Dead)
}

// testStatsLapsedAndDue: Ready counts what is deliverable now, with no
// Receive needed to make it so: a message whose lease lapsed (or whose
// connection was cut, with a Disconnecter) and one whose NotBefore has
// passed are Ready, not InFlight or Scheduled, to a backend that never
// called Receive, within five seconds (as Stats/Depths).
func testStatsLapsedAndDue(t *testing.T, e *env) {
	b := e.declared()
	observer := e.backend() // it never calls Receive
	e.put(b, time.Time{}, "lapsing")
	e.receiveN(b, 1, e.lease)
	from := time.Now().Add(e.lease)
	nb := time.Now().Add(e.scaled(300 * time.Millisecond))
	e.put(observer, nb, "due")
	ctx := ctxT(t, e.opts.Wait+e.lease)
	if dis, ok := e.h.(Disconnecter); ok {
		if err := dis.Disconnect(ctx, b); err != nil {
			t.Fatalf("Disconnect: %v", err)
		}
		from = time.Now()
	}
	time.Sleep(time.Until(from.Add(max(nb.Sub(from), 0))))
	want := driver.Stats{Ready: 2}
	var st driver.Stats
	var err error
	deadline := time.Now().Add(e.bound(5 * time.Second))
	for {
		st, err = observer.Stats(ctx, e.queue)
		if err != nil {
			t.Fatalf("Stats: %v", err)
		}
		if statsMatch(st, want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(e.scaled(50 * time.Millisecond))
	}
	if !statsMatch(st, want) {
		t.Errorf("Stats = %s, want %s (or -1 for a figure the backend cannot tell): a queue holding one message whose lease lapsed and one whose NotBefore passed, "+
			"which no Receive has looked at since; Ready is what is deliverable now", fmtStats(st), fmtStats(want))
	}
}

// statsMatch reports whether st is want, figure by figure, where -1 (the
// backend cannot tell) matches anything.
func statsMatch(st, want driver.Stats) bool {
	for _, f := range [][2]int64{{st.Ready, want.Ready}, {st.Scheduled, want.Scheduled}, {st.InFlight, want.InFlight}, {st.Dead, want.Dead}} {
		if f[0] != f[1] && f[0] != -1 {
			return false
		}
	}
	return true
}

// testStatsOldestReady: Stats.OldestReady is when the ready job that has
// waited longest became deliverable: zero with nothing ready (a scheduled
// job is not ready), a due job's NotBefore (not its enqueue time, nor a
// newer job's), and, once a lease lapses, the lapse (not the enqueue),
// also after a Receive has moved lapsed jobs back to the ready ones.
// Zero with jobs ready is how a backend says it cannot tell.
func testStatsOldestReady(t *testing.T, e *env) {
	b := e.declared()
	ctx := ctxT(t, e.opts.Wait+e.lease+e.bound(20*time.Second))
	// statsWhen reads Stats until Ready is n (or -1), for five seconds.
	statsWhen := func(n int64) driver.Stats {
		t.Helper()
		deadline := time.Now().Add(e.bound(5 * time.Second))
		for {
			st, err := b.Stats(ctx, e.queue)
			if err != nil {
				t.Fatalf("Stats: %v", err)
			}
			if st.Ready == n || st.Ready == -1 || time.Now().After(deadline) {
				return st
			}
			time.Sleep(e.scaled(50 * time.Millisecond))
		}
	}
	if st := statsWhen(0); !st.OldestReady.IsZero() {
		t.Errorf("OldestReady of an empty queue = %v, want zero", st.OldestReady)
	}
	gap := e.scaled(time.Second)
	tol := gap / 4
	nb := time.Now().Add(gap)
	e.put(b, nb, "due")
	if st := statsWhen(0); st.Ready == 0 && !st.OldestReady.IsZero() {
		t.Errorf("OldestReady = %v with only a job scheduled %v ahead, want zero: a scheduled job is not ready", st.OldestReady, gap)
	}
	time.Sleep(time.Until(nb.Add(gap)))
	e.put(b, time.Time{}, "fresh")
	st := statsWhen(2)
	if st.OldestReady.IsZero() {
		t.Logf("the backend cannot tell OldestReady (zero with Ready %d)", st.Ready)
		return
	}
	if d := st.OldestReady.Sub(nb); d < -tol || d > tol {
		t.Errorf("OldestReady = %v, %v from the due job's NotBefore (want within %v): a job enqueued %v before it came due and one enqueued %v after are ready",
			st.OldestReady.Format(time.RFC3339Nano), d, tol, gap, gap)
	}
	// Three leases lapse; a Receive takes one of the three back (a
	// backend may move them all back to its ready jobs for it).
	e.put(b, time.Time{}, "third")
	statsWhen(3)
	time.Sleep(gap) // the lapse comes well after every enqueue
	received := time.Now()
	e.receiveN(b, 3, e.lease)
	time.Sleep(e.lease + tol)
	e.receiveN(b, 1, 4*e.opts.Wait)
	st = statsWhen(2)
	if st.Ready == 2 && !st.OldestReady.IsZero() && (st.OldestReady.Before(received.Add(-tol)) || st.OldestReady.After(time.Now().Add(tol))) {
		t.Errorf("OldestReady = %v after the leases taken at %v lapsed (lease %v): want the lapse, not when the jobs were enqueued or came due",
			st.OldestReady.Format(time.RFC3339Nano), received.Format(time.RFC3339Nano), e.lease)
	}
}
