package conformance

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// tracking is the suite's config with status tracking on (results, status
// and cancellation).
func (e *env) tracking() ap.Config {
	cfg := e.config()
	cfg.TrackStatus = true
	cfg.StatusRetention = 10 * time.Minute
	return cfg
}

func (e *env) status(p *ap.Platform, id string) ap.JobStatus {
	e.t.Helper()
	st, err := p.Status(ctxT(e.t, e.opts.Wait), id)
	if err != nil {
		e.t.Fatalf("Status(%s): %v", id, err)
	}
	return st
}

// testStatusWalk: a job that fails twice then succeeds is waiting, running,
// retrying, running, retrying, running, then succeeded with its result.
func testStatusWalk(t *testing.T, e *env) {
	cfg := e.tracking()
	// One worker, so that attempts do not overlap. Attempt k's hook reads
	// the status after attempt k's end is written; by then the retry copy
	// may be running already (its backoff's full jitter can be zero, and
	// a loaded machine widens the gap), and the status shows the latest
	// attempt: the hook sees attempt k's end or a later attempt's state.
	queues := make(map[string]ap.QueueConfig, len(cfg.Queues))
	for name, qc := range cfg.Queues {
		queues[name] = qc
	}
	qc := queues[e.queue]
	qc.Concurrency = 1
	queues[e.queue] = qc
	cfg.Queues = queues
	type seenState struct {
		after   int // the attempt whose hook read it
		outcome ap.Outcome
		state   ap.JobState
		tries   int
	}
	var mu sync.Mutex
	var seen []seenState
	var w *worker
	cfg.Hooks.AfterAttempt = func(ctx context.Context, a ap.Attempt) {
		st, err := w.P.Status(ctx, a.Job.ID) // written before the hook runs
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			t.Errorf("Status after attempt %d: %v", a.Job.TryCount, err)
			return
		}
		seen = append(seen, seenState{a.Job.TryCount, a.Outcome, st.State, st.Tries})
	}
	w = e.worker(cfg)
	w.handle(t, "walk", func(ctx context.Context, j *ap.Job) error {
		st, err := w.P.Status(ctx, j.ID)
		if err != nil || st.State != ap.StateRunning || st.Tries != j.TryCount {
			t.Errorf("inside the handler (try %d): status %+v, %v; want running with tries %d", j.TryCount, st, err, j.TryCount)
		}
		if j.Failures < 2 {
			return errors.New("not yet")
		}
		j.SetResult([]byte("done"))
		return nil
	})
	job := &ap.Job{Type: "walk"}
	e.enqueue(w.P, job)
	if st := e.status(w.P, job.ID); st.State != ap.StateWaiting || st.Queue != e.queue || st.Type != "walk" {
		t.Errorf("after Enqueue: %+v, want waiting on %s", st, e.queue)
	}
	w.start(t)
	// Two failures, then success. An attempt whose lease a loaded machine
	// lost (OutcomeLeaseLost, a crash) comes between them: counted, and
	// its status stays that attempt's running.
	var got []seenState
	e.waitFor("success after two failures", func() bool {
		mu.Lock()
		defer mu.Unlock()
		got = append(got[:0], seen...)
		return len(got) > 0 && got[len(got)-1].outcome == ap.OutcomeSucceeded
	})
	after := map[ap.Outcome]ap.JobState{ap.OutcomeRetried: ap.StateRetrying, ap.OutcomeSucceeded: ap.StateSucceeded, ap.OutcomeLeaseLost: ap.StateRunning}
	crashes := 0
	for i, s := range got {
		k := i + 1
		want, known := after[s.outcome]
		if s.outcome == ap.OutcomeLeaseLost {
			crashes++
		}
		switch {
		case s.after != k:
			t.Errorf("hook %d ran after attempt %d", k, s.after)
		case !known:
			t.Errorf("attempt %d ended %s, want retried, succeeded (or lease_lost on a loaded machine)", k, s.outcome)
		case s.tries == k && s.state == want:
		case s.tries > k && s.outcome != ap.OutcomeSucceeded: // a later attempt's state
			t.Logf("after attempt %d the status showed attempt %d already (%s)", k, s.tries, s.state)
		default:
			t.Errorf("after attempt %d (%s) the status was %s of attempt %d, want %s of attempt %d (or a later attempt's state)", k, s.outcome, s.state, s.tries, want, k)
		}
	}
	st := e.status(w.P, job.ID)
	if st.State != ap.StateSucceeded || string(st.Result) != "done" || st.Tries != len(got) || st.Failures != 2 || st.Crashes != crashes || st.Error != "not yet" || st.Worker == "" {
		t.Errorf("final status %+v; want succeeded, result done, %d tries, 2 failures, %d crashes, last error kept, a worker", st, len(got), crashes)
	}
	if crashes > 0 {
		t.Logf("%d attempts lost their lease%s", crashes, e.stallNote())
	}
	if o := e.rec.outcomes(job.ID); len(o) == 0 || string(o[len(o)-1].Result) != "done" {
		t.Errorf("Attempt.Result of the last attempt: want done (outcomes %v)", o)
	}
}

// testResultJSON: JSONResult's value is the job's result, in its status.
func testResultJSON(t *testing.T, e *env) {
	type sum struct{ A, B int }
	type total struct{ N int }
	w := e.worker(e.tracking()).handle(t, "sum", ap.JSONResult(func(_ context.Context, _ *ap.Job, s sum) (total, error) {
		return total{N: s.A + s.B}, nil
	}))
	job, err := ap.NewJSONJob("sum", sum{2, 3})
	if err != nil {
		t.Fatal(err)
	}
	e.enqueue(w.P, job)
	w.start(t)
	var st ap.JobStatus
	e.waitFor("the job's success", func() bool { st = e.status(w.P, job.ID); return st.State == ap.StateSucceeded })
	got, err := ap.DecodeResult[total](st.Result)
	if err != nil || got.N != 5 {
		t.Errorf("result %s: %+v, %v; want N 5", st.Result, got, err)
	}
}

// testCancelWaiting: a job cancelled before it runs never runs; it is
// dead-lettered as cancelled.
func testCancelWaiting(t *testing.T, e *env) {
	prod := e.worker(e.tracking()).P
	job := &ap.Job{Type: "never", NotBefore: time.Now().Add(e.scaled(time.Second))}
	e.enqueue(prod, job)
	// A status written after NotBefore is rightly "waiting" (the job is due):
	// only a read before NotBefore is judged.
	switch st := e.status(prod, job.ID); {
	case st.State == ap.StateScheduled:
	case time.Now().Before(job.NotBefore):
		t.Errorf("a delayed job's status is %s, want scheduled", st.State)
	default:
		t.Logf("not judged whether a delayed job's status is scheduled: its delay ended before it was read (the machine is loaded); it is %s", st.State)
	}
	if err := prod.Cancel(ctxT(t, e.opts.Wait), job.ID); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	if err := prod.Cancel(ctxT(t, e.opts.Wait), "no-such-job"); !errors.Is(err, ap.ErrJobNotFound) {
		t.Errorf("Cancel of an unknown job: %v, want ErrJobNotFound", err)
	}
	w := e.worker(e.tracking()).handle(t, "never", func(context.Context, *ap.Job) error {
		t.Error("a cancelled job ran")
		return nil
	}).start(t)
	dl := e.waitDead(w.P, 1)[0]
	if dl.Reason != ap.ReasonCancelled || dl.Job.ID != job.ID || dl.Job.TryCount != 0 {
		t.Errorf("dead letter %s %q tries %d, want %s cancelled 0", dl.Job.ID, dl.Reason, dl.Job.TryCount, job.ID)
	}
	// The dead-letter hook may run before the worker writes the final status.
	var st ap.JobStatus
	e.waitFor("the cancelled status", func() bool { st = e.status(prod, job.ID); return st.State == ap.StateCancelled })
	if st.Reason != ap.ReasonCancelled {
		t.Errorf("status %s %q, want cancelled", st.State, st.Reason)
	}
	if err := prod.Cancel(ctxT(t, e.opts.Wait), job.ID); !errors.Is(err, ap.ErrJobFinished) {
		t.Errorf("Cancel of a cancelled job: %v, want ErrJobFinished", err)
	}
}

// testCancelRunning: a running job's context ends within 2 s of Cancel with
// ErrJobCancelled, and the job is not retried.
func testCancelRunning(t *testing.T, e *env) {
	started := make(chan struct{}, 1)
	ended := make(chan error, 1)
	cfg := e.tracking()
	cfg.Policy.RetryLimit = ap.Limit(5)
	w := e.worker(cfg).handle(t, "long", func(ctx context.Context, _ *ap.Job) error {
		started <- struct{}{}
		<-ctx.Done()
		ended <- context.Cause(ctx)
		return ctx.Err()
	}, ap.Policy{Timeout: time.Minute})
	job := &ap.Job{Type: "long"}
	e.enqueue(w.P, job)
	w.start(t)
	select {
	case <-started:
	case <-time.After(e.opts.Wait):
		t.Fatal("the handler never started")
	}
	prod := e.worker(e.tracking()).P
	at := time.Now()
	if err := prod.Cancel(ctxT(t, e.opts.Wait), job.ID); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	select {
	case cause := <-ended:
		if d := time.Since(at); d > e.bound(2*time.Second) {
			t.Errorf("the handler's context ended %v after Cancel, want within %v", d, e.bound(2*time.Second))
		}
		if !errors.Is(cause, ap.ErrJobCancelled) || !errors.Is(cause, context.Canceled) {
			t.Errorf("the context's cause is %v, want ErrJobCancelled (a context.Canceled)", cause)
		}
	case <-time.After(e.bound(5*time.Second) + e.opts.Wait):
		t.Fatal("the handler's context did not end after Cancel")
	}
	dl := e.waitDead(w.P, 1)[0]
	e.settle()
	if n := e.rec.count(job.ID); n != 1 || dl.Reason != ap.ReasonCancelled || dl.Job.Failures != 0 {
		t.Errorf("%d attempts, dead letter %q with %d failures; want 1 attempt, cancelled, uncounted", n, dl.Reason, dl.Job.Failures)
	}
	if st := e.status(prod, job.ID); st.State != ap.StateCancelled {
		t.Errorf("status %s, want cancelled", st.State)
	}
}

// testStatusAfterStop: a worker writes the status of the jobs it settled
// by the time its Stop returns: another process reads every end then,
// without waiting for it.
func testStatusAfterStop(t *testing.T, e *env) {
	const n = 50
	w := e.worker(e.tracking()).handle(t, "quick", func(context.Context, *ap.Job) error { return nil })
	jobs := make([]*ap.Job, n)
	for i := range jobs {
		jobs[i] = &ap.Job{Type: "quick"}
	}
	e.enqueue(w.P, jobs...)
	w.start(t)
	// The hook runs once the attempt is settled: its status is handed to
	// the worker's writer, not necessarily written.
	e.waitFor("every job's success", func() bool {
		for _, j := range jobs {
			o := e.rec.outcomes(j.ID)
			if len(o) == 0 || o[len(o)-1].Outcome != ap.OutcomeSucceeded {
				return false
			}
		}
		return true
	})
	w.stop(t, e.opts.Wait)
	prod := e.worker(e.tracking()).P
	for _, j := range jobs {
		if st := e.status(prod, j.ID); st.State != ap.StateSucceeded {
			t.Errorf("job %s: status %s after the worker's Stop, want succeeded", j.ID, st.State)
		}
	}
}
