package conformance

import (
	"context"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// testPause: a queue paused from another platform (an admin process) takes
// nothing for 3 s — neither the jobs enqueued while it is paused nor those
// its worker had claimed ahead, which are handed back — while the handler
// running when it was paused finishes. After Resume every job runs once,
// with no try spent by the pause. A worker started while the queue is
// paused takes nothing either.
func testPause(t *testing.T, e *env) {
	cfg := e.config()
	cfg.Queues = map[string]ap.QueueConfig{e.queue: {Concurrency: 1, Prefetch: ap.Limit(3)}}
	h, started, release := blocker()
	w := e.worker(cfg).handle(t, "p", func(ctx context.Context, j *ap.Job) error {
		if j.Headers["slow"] == "1" {
			return h(ctx, j)
		}
		return nil
	})
	admin := e.producer()
	slow := &ap.Job{Type: "p", Headers: map[string]string{"slow": "1"}}
	e.enqueue(admin, slow)
	w.start(t)
	select {
	case <-started:
	case <-time.After(e.opts.Wait):
		t.Fatalf("the first job never started\n%s", e.rec)
	}
	var jobs []*ap.Job
	for range 3 { // claimed ahead by the worker while its one handler is busy
		jobs = append(jobs, &ap.Job{Type: "p"})
	}
	e.enqueue(admin, jobs...)
	time.Sleep(e.scaled(200 * time.Millisecond))

	ctx := ctxT(t, e.opts.Wait)
	if err := admin.Pause(ctx, e.queue); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	t.Cleanup(func() { _ = admin.Resume(context.Background(), e.queue) })
	if err := admin.Pause(ctx, e.queue); err != nil {
		t.Fatalf("Pause of a paused queue: %v, want nil", err)
	}
	time.Sleep(2*ap.PausePoll + e.scaled(200*time.Millisecond)) // every worker has read it
	close(release)                                              // the running handler finishes
	e.waitFor("the running job to finish", func() bool {
		o := e.rec.outcomes(slow.ID)
		return len(o) == 1 && o[0].Outcome == ap.OutcomeSucceeded
	})
	var more []*ap.Job
	for range 5 {
		more = append(more, &ap.Job{Type: "p"})
	}
	e.enqueue(admin, more...)
	jobs = append(jobs, more...)
	late := e.worker(e.config()).handle(t, "p", ok).start(t) // started while paused
	_ = late

	time.Sleep(3 * time.Second)
	for _, j := range jobs {
		if n := e.rec.count(j.ID); n != 0 {
			t.Fatalf("job %s ran %d times while its queue was paused\n%s", j.ID, n, e.rec)
		}
	}
	st, err := admin.Stats(ctx, e.queue)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	if !st.Paused {
		t.Errorf("Stats of a paused queue: %+v, want Paused", st)
	}
	if st.Ready != -1 && st.Ready != int64(len(jobs)) {
		t.Errorf("Stats of a paused queue: Ready %d, want %d (every job waiting)", st.Ready, len(jobs))
	}
	if q, err := admin.PausedQueues(ctx); err != nil || !contains(q, e.queue) {
		t.Errorf("PausedQueues = %q, %v; want it to name %q", q, err, e.queue)
	}

	if err := admin.Resume(ctx, e.queue); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	for _, j := range jobs {
		e.waitFor("every job to run after Resume", func() bool { return e.rec.count(j.ID) > 0 })
	}
	e.settle()
	for _, j := range jobs {
		for _, at := range e.rec.of(j.ID) {
			if at.TryCount != 1 || at.Failures != 0 || at.Crashes != 0 {
				t.Errorf("job %s attempt %+v: a pause must not spend a try", j.ID, at)
			}
		}
		if n := e.rec.count(j.ID); n != 1 {
			t.Errorf("job %s ran %d times, want once", j.ID, n)
		}
	}
	if st, err := admin.Stats(ctx, e.queue); err != nil || st.Paused {
		t.Errorf("Stats after Resume: %+v, %v; want not paused", st, err)
	}
	if err := admin.Resume(ctx, e.queue); err != nil {
		t.Errorf("Resume of a running queue: %v, want nil", err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
