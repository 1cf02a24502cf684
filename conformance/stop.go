package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

func testStopHandsBack(t *testing.T, e *env) {
	cfg := e.config()
	cfg.Queues = map[string]ap.QueueConfig{e.queue: {Concurrency: 1, Prefetch: ap.Limit(2)}}
	h, started, _ := blocker()
	a := e.worker(cfg).handle(t, "s", h)
	jobs := []*ap.Job{{Type: "s"}, {Type: "s"}, {Type: "s"}}
	e.enqueue(a.P, jobs...)
	a.start(t)
	select {
	case <-started:
	case <-time.After(e.opts.Wait):
		t.Fatalf("the job never started")
	}
	time.Sleep(100 * time.Millisecond) // let the prefetch fill
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := a.P.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Stop with a handler still running: %v, want DeadlineExceeded", err)
	}
	b := e.worker(e.config()).handle(t, "s", ok).start(t)
	for _, j := range jobs {
		e.waitFor("every handed-back job", func() bool {
			for _, o := range e.rec.outcomes(j.ID) {
				if o.Outcome == ap.OutcomeSucceeded {
					return true
				}
			}
			return false
		})
		for _, at := range e.rec.of(j.ID) {
			if at.TryCount != 1 || at.Failures != 0 || at.Crashes != 0 {
				t.Errorf("job %s attempt %+v: a hand-back must not spend a try", j.ID, at)
			}
		}
	}
	if len(e.dead(b.P)) != 0 {
		t.Errorf("dead letters after a graceful stop")
	}
}

func testStopFinishes(t *testing.T, e *env) {
	started := make(chan struct{}, 1)
	a := e.worker(e.config()).handle(t, "f", func(context.Context, *ap.Job) error {
		started <- struct{}{}
		time.Sleep(300 * time.Millisecond)
		return nil
	})
	job := &ap.Job{Type: "f"}
	e.enqueue(a.P, job)
	a.start(t)
	select {
	case <-started:
	case <-time.After(e.opts.Wait):
		t.Fatalf("the job never started\n%s", e.rec)
	}
	if err := a.P.Stop(ctxT(t, e.opts.Wait)); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if o := e.rec.outcomes(job.ID); len(o) != 1 || o[0].Outcome != ap.OutcomeSucceeded {
		t.Fatalf("outcomes after Stop: %+v, want one success", o)
	}
	e.worker(e.config()).handle(t, "f", ok).start(t)
	e.settle()
	if n := e.rec.count(job.ID); n != 1 {
		t.Errorf("a job finished before Stop returned ran %d times", n)
	}
}
