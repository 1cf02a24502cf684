package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
)

func testDeadAtOnce(t *testing.T, e *env, ret error, reason ap.Reason) {
	w := e.worker(e.config()).handle(t, "t", func(context.Context, *ap.Job) error { return ret })
	job := &ap.Job{Type: "t"}
	e.enqueue(w.P, job)
	w.start(t)
	dl := e.waitDead(w.P, 1)[0]
	e.settle()
	if n := e.rec.count(job.ID); n != 1 {
		t.Errorf("%d attempts, want 1 (never retried)", n)
	}
	if dl.Reason != reason || dl.Job.Failures != 1 || dl.Job.TryCount != 1 {
		t.Errorf("dead letter reason %q failures %d tries %d; want %q 1 1", dl.Reason, dl.Job.Failures, dl.Job.TryCount, reason)
	}
	if dl.Error != ret.Error() {
		t.Errorf("dead letter error %q, want %q", dl.Error, ret.Error())
	}
}

func testInvalid(t *testing.T, e *env) {
	testDeadAtOnce(t, e, ap.Invalid(errors.New("bad json")), ap.ReasonInvalid)
}

func testPermanent(t *testing.T, e *env) {
	testDeadAtOnce(t, e, fmt.Errorf("wrapped: %w", ap.Permanent(errors.New("no such account"))), ap.ReasonPermanent)
}

func testReject(t *testing.T, e *env) {
	cfg := e.config()
	cfg.Policy.RetryLimit = ap.Limit(0)
	w := e.worker(cfg).handle(t, "r", func(_ context.Context, j *ap.Job) error {
		if e.rec.count(j.ID) <= 3 {
			return ap.Reject(errors.New("dependency down"))
		}
		return nil
	})
	job := &ap.Job{Type: "r"}
	e.enqueue(w.P, job)
	w.start(t)
	e.waitFor("success after three rejects", func() bool {
		o := e.rec.outcomes(job.ID)
		return len(o) == 4 && o[3].Outcome == ap.OutcomeSucceeded
	})
	checkTries(t, e.rec.of(job.ID), [3]int{1, 0, 0}, [3]int{1, 0, 0}, [3]int{1, 0, 0}, [3]int{1, 0, 0})
	if len(e.dead(w.P)) != 0 {
		t.Errorf("a rejected job with RetryLimit 0 was dead-lettered: Reject must not count")
	}
}

func testPanic(t *testing.T, e *env) {
	cfg := e.config()
	cfg.Policy.RetryLimit = ap.Limit(1)
	w := e.worker(cfg).handle(t, "boom", func(context.Context, *ap.Job) error { panic("kaboom") })
	job := &ap.Job{Type: "boom"}
	e.enqueue(w.P, job)
	w.start(t)
	dl := e.waitDead(w.P, 1)[0]
	if n := e.rec.count(job.ID); n != 2 {
		t.Errorf("%d attempts, want 2 (a panic is a failure, retried)", n)
	}
	if dl.Reason != ap.ReasonRetriesExceeded || !bytes.Contains([]byte(dl.Error), []byte("kaboom")) || !bytes.Contains([]byte(dl.Error), []byte("goroutine")) {
		t.Errorf("dead letter reason %q error %q; want retries_exceeded with the panic and its stack", dl.Reason, dl.Error)
	}
}

func testTimeout(t *testing.T, e *env) {
	w := e.worker(e.config()).handle(t, "slow", func(ctx context.Context, _ *ap.Job) error {
		<-ctx.Done()
		return ctx.Err()
	}, ap.Policy{Timeout: 100 * time.Millisecond, RetryLimit: ap.Limit(1)})
	job := &ap.Job{Type: "slow"}
	e.enqueue(w.P, job)
	w.start(t)
	dl := e.waitDead(w.P, 1)[0]
	checkTries(t, e.rec.of(job.ID), [3]int{1, 0, 0}, [3]int{2, 1, 0})
	if dl.Reason != ap.ReasonRetriesExceeded || !bytes.Contains([]byte(dl.Error), []byte("timed out")) {
		t.Errorf("dead letter reason %q error %q; want retries_exceeded, timed out", dl.Reason, dl.Error)
	}
}

func testUnhandled(t *testing.T, e *env) {
	w := e.worker(e.config()).handle(t, "known", ok)
	job := &ap.Job{Type: "unknown"}
	e.enqueue(w.P, job)
	w.start(t)
	dl := e.waitDead(w.P, 1)[0]
	if dl.Reason != ap.ReasonUnhandled || dl.Job.ID != job.ID || dl.Job.TryCount != 0 {
		t.Errorf("dead letter reason %q job %s tries %d; want unhandled %s 0", dl.Reason, dl.Job.ID, dl.Job.TryCount, job.ID)
	}
	if n := e.rec.count(job.ID); n != 0 {
		t.Errorf("%d handler calls for a job with no handler", n)
	}
}

func testUnhandledThenHandled(t *testing.T, e *env) {
	cfg := e.config()
	cfg.UnhandledRetries = ap.Limit(1000)
	w := e.worker(cfg)
	job := &ap.Job{Type: "late"}
	e.enqueue(w.P, job)
	w.start(t)
	time.Sleep(200 * time.Millisecond) // a few requeues while no handler exists
	w.handle(t, "late", ok)            // the rolling deploy arrives
	e.waitFor("the late handler to run", func() bool { return e.rec.count(job.ID) == 1 })
	checkTries(t, e.rec.of(job.ID), [3]int{1, 0, 0})
}

func testExpired(t *testing.T, e *env) {
	w := e.worker(e.config()).handle(t, "e", ok)
	job := &ap.Job{Type: "e", Deadline: time.Now().Add(100 * time.Millisecond)}
	e.enqueue(w.P, job)
	time.Sleep(200 * time.Millisecond)
	w.start(t)
	dl := e.waitDead(w.P, 1)[0]
	if dl.Reason != ap.ReasonExpired || dl.Job.ID != job.ID {
		t.Errorf("dead letter reason %q job %s; want expired %s", dl.Reason, dl.Job.ID, job.ID)
	}
	if n := e.rec.count(job.ID); n != 0 {
		t.Errorf("an expired job ran %d times", n)
	}
}

func testForeignBytes(t *testing.T, e *env) {
	w := e.worker(e.config()).handle(t, "x", ok)
	garbage := [][]byte{[]byte("not a job"), {0xA5, 'J', 1, 0xff, 0xff}, {}}
	ctx := ctxT(t, e.opts.Wait)
	if err := w.B.Declare(ctx, e.queue); err != nil {
		t.Fatal(err)
	}
	for i, g := range garbage {
		if err := w.B.Enqueue(ctx, e.queue, []driver.Message{{ID: fmt.Sprintf("garbage-%d", i), Body: g}}); err != nil {
			t.Fatalf("writing garbage straight to the queue: %v", err)
		}
	}
	good := &ap.Job{Type: "x"}
	e.enqueue(w.P, good)
	w.start(t)
	dls := e.waitDead(w.P, len(garbage))
	found := map[string]bool{}
	for _, dl := range dls {
		if dl.Reason != ap.ReasonInvalid || dl.Raw == nil {
			t.Errorf("dead letter reason %q raw %v; want invalid with the raw bytes", dl.Reason, dl.Raw != nil)
		}
		found[string(dl.Raw)] = true
	}
	for _, g := range garbage {
		if !found[string(g)] {
			t.Errorf("garbage %q not kept in a dead letter", g)
		}
	}
	e.waitFor("the good job behind the garbage", func() bool { return e.rec.count(good.ID) == 1 })
}
