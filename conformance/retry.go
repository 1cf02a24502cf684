package conformance

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"

	"github.com/asyncplatform/asyncplatform/driver"
)

func testTryCountUp(t *testing.T, e *env) {
	w := e.worker(e.config()).handle(t, "flaky", func(_ context.Context, j *ap.Job) error {
		if j.TryCount < 3 {
			return fmt.Errorf("failure %d", j.TryCount)
		}
		return nil
	})
	job := &ap.Job{Type: "flaky"}
	e.enqueue(w.P, job)
	w.start(t)
	e.waitFor("a success on the third try", func() bool {
		o := e.rec.outcomes(job.ID)
		return len(o) == 3 && o[2].Outcome == ap.OutcomeSucceeded
	})
	e.settle()
	got := e.rec.of(job.ID)
	checkTries(t, got, [3]int{1, 0, 0}, [3]int{2, 1, 0}, [3]int{3, 2, 0})
	if n := len(got[2].Job.Errors); n != 2 {
		t.Errorf("third attempt sees %d error lines, want 2: %q", n, got[2].Job.Errors)
	}
	if len(e.dead(w.P)) != 0 {
		t.Errorf("a job that succeeded was dead-lettered")
	}
}

func failing(context.Context, *ap.Job) error { return errors.New("always fails") }

func testDefaultRetryLimit(t *testing.T, e *env) {
	w := e.worker(e.config()).handle(t, "fail", failing)
	job := &ap.Job{Type: "fail"}
	e.enqueue(w.P, job)
	w.start(t)
	dls := e.waitDead(w.P, 1)
	if n := e.rec.count(job.ID); n != ap.DefaultRetryLimit+1 {
		t.Errorf("attempts = %d, want DefaultRetryLimit+1 = %d", n, ap.DefaultRetryLimit+1)
	}
	dl := dls[0]
	if dl.Reason != ap.ReasonRetriesExceeded || dl.Job.ID != job.ID {
		t.Errorf("dead letter %s reason %q, want %s %q", dl.Job.ID, dl.Reason, job.ID, ap.ReasonRetriesExceeded)
	}
	if dl.Job.TryCount != ap.DefaultRetryLimit+1 || dl.Job.Failures != ap.DefaultRetryLimit+1 || dl.Job.Crashes != 0 {
		t.Errorf("dead letter counters TryCount/Failures/Crashes = %d/%d/%d", dl.Job.TryCount, dl.Job.Failures, dl.Job.Crashes)
	}
	if len(dl.Job.Errors) != ap.DefaultRetryLimit+1 || dl.Error != "always fails" {
		t.Errorf("dead letter error %q, history %d lines", dl.Error, len(dl.Job.Errors))
	}
	if dl.Worker == "" || dl.DeadAt.IsZero() || dl.Queue != e.queue {
		t.Errorf("dead letter worker %q, time %v, queue %q", dl.Worker, dl.DeadAt, dl.Queue)
	}
}

func testRetryPrecedence(t *testing.T, e *env) {
	// platform 4 < queue 3 < type 2 < job; a second queue has no policy of its own.
	other := e.queue + "-b"
	cfg := e.config()
	cfg.Policy.RetryLimit = ap.Limit(4)
	cfg.Queues = map[string]ap.QueueConfig{
		e.queue: {Concurrency: 4, Policy: ap.Policy{RetryLimit: ap.Limit(3)}},
		other:   {Concurrency: 4},
	}
	w := e.worker(cfg).
		handle(t, "typed", failing, ap.Policy{RetryLimit: ap.Limit(1)}).
		handle(t, "plain", failing)
	t.Cleanup(func() { _, _ = w.P.PurgeDeadLetters(context.Background(), other) })
	cases := []struct {
		job  *ap.Job
		want int
	}{
		{&ap.Job{Type: "plain"}, 4}, // queue
		{&ap.Job{Type: "typed"}, 2}, // type
		{&ap.Job{Type: "typed", Policy: ap.Policy{RetryLimit: ap.Limit(0)}}, 1}, // job
		{&ap.Job{Type: "plain", Queue: other}, 5},                               // platform
	}
	for _, c := range cases {
		e.enqueue(w.P, c.job)
	}
	w.start(t)
	e.waitDead(w.P, 3)
	e.waitFor("the other queue's dead letter", func() bool {
		page, err := w.P.DeadLetters(context.Background(), other, "", 10)
		return err == nil && len(page.Letters) == 1
	})
	if d, ok := w.B.(driver.QueueDeleter); ok {
		t.Cleanup(func() { _ = d.DeleteQueue(context.Background(), other) })
	}
	for i, c := range cases {
		if n := e.rec.count(c.job.ID); n != c.want {
			t.Errorf("case %d (%s, queue %s): %d attempts, want %d", i, c.job.Type, c.job.Queue, n, c.want)
		}
	}
}

func testBackoffRespected(t *testing.T, e *env) {
	cfg := e.config()
	cfg.Policy.BackoffBase, cfg.Policy.BackoffCap = 400*time.Millisecond, 400*time.Millisecond
	w := e.worker(cfg).handle(t, "once", func(_ context.Context, j *ap.Job) error {
		if j.TryCount == 1 {
			return errors.New("first try fails")
		}
		return nil
	})
	job := &ap.Job{Type: "once"}
	e.enqueue(w.P, job)
	w.start(t)
	// The retry may start before the first attempt's hook has run (the
	// jitter can be near 0): wait for both.
	e.waitFor("the retry", func() bool { return e.rec.count(job.ID) == 2 && len(e.rec.outcomes(job.ID)) >= 1 })
	o := e.rec.outcomes(job.ID)[0]
	if o.Outcome != ap.OutcomeRetried {
		t.Fatalf("first outcome %q, want retried", o.Outcome)
	}
	second := e.rec.of(job.ID)[1].At
	if second.Before(o.RetryAt) {
		t.Errorf("the retry ran %v before its backoff ended", o.RetryAt.Sub(second))
	}
	first := e.rec.of(job.ID)[0].At
	// RetryAt is set just after the handler returns: the gap is the
	// handler's run, the backoff and the little between them.
	if gap := o.RetryAt.Sub(first); gap > 400*time.Millisecond+o.Duration+e.bound(100*time.Millisecond) {
		t.Errorf("backoff %v exceeds the 400ms cap%s", gap-o.Duration, e.stallNote())
	}
}
