package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
// second worker waiting for it. A renewal needs the process to run: when a
// round fails and this process stalled for a quarter of the lease or more
// during it (a loaded machine, not the backend), the case says so and runs
// again with a lease twice as long, at most slowRounds times in all. A
// failure without such a stall fails at once.
func testLeaseExtension(t *testing.T, e *env) {
	lease := e.lease
	for round := 1; ; round++ {
		start := time.Now()
		problems := slowHandlerRound(t, e, lease, round)
		if len(problems) == 0 {
			return
		}
		stalled := stalls.longest(start)
		if stalled < lease/4 || round == slowRounds {
			for _, p := range problems {
				t.Error(p)
			}
			if stalled > 0 {
				t.Logf("round %d of %d, lease %v: the longest stall of this test process was %v", round, slowRounds, lease, stalled.Round(time.Millisecond))
			}
			return
		}
		t.Logf("round %d, lease %v: %s; this test process stalled for up to %v meanwhile (the machine is loaded), so the lease is doubled and the case runs again",
			round, lease, strings.Join(problems, "; "), stalled.Round(time.Millisecond))
		lease *= 2
	}
}

// slowHandlerRound runs one job whose handler takes ten leases, with two
// workers competing for it, and returns what went wrong. Its workers are
// stopped before it returns. Each round has a job type of its own; a job
// left over from an earlier round is done at once.
func slowHandlerRound(t *testing.T, e *env, lease time.Duration, round int) []string {
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
	var problems []string
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
		ctx, cancel := context.WithTimeout(context.Background(), e.scaled(time.Second))
		_ = w.P.Stop(ctx) // a second delivery still running is handed back
		cancel()
	}
	return problems
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
