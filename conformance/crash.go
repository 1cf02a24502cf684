package conformance

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
)

// blocker returns a handler that signals started and blocks until released
// (or its context ends).
func blocker() (ap.Handler, chan string, chan struct{}) {
	started, release := make(chan string, 16), make(chan struct{})
	return func(ctx context.Context, j *ap.Job) error {
		started <- j.ID
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}, started, release
}

// crashOnce runs a worker that takes the job and then dies (its backend is
// closed under it without an outcome).
func (e *env) crashOnce(t *testing.T, jobType string, policy ...ap.Policy) bool {
	cfg := e.config()
	cfg.Queues = map[string]ap.QueueConfig{e.queue: {Concurrency: 1, Prefetch: ap.Limit(0)}}
	h, started, release := blocker()
	w := e.worker(cfg).handle(t, jobType, h, policy...).start(t)
	defer close(release)
	select {
	case <-started:
		_ = w.B.Close() // the process dies
		return true
	case <-time.After(e.opts.Wait):
		return false
	}
}

func testCrashRedelivered(t *testing.T, e *env) {
	job := &ap.Job{Type: "c"}
	e.enqueue(e.producer(), job)
	if !e.crashOnce(t, "c") {
		t.Fatalf("the first worker never got the job")
	}
	w := e.worker(e.config()).handle(t, "c", ok).start(t)
	e.waitFor("redelivery after the crash", func() bool { return e.rec.count(job.ID) == 2 })
	checkTries(t, e.rec.of(job.ID), [3]int{1, 0, 0}, [3]int{2, 0, 1})
	e.settle()
	if n := e.rec.count(job.ID); n != 2 {
		t.Errorf("%d attempts after the redelivery succeeded, want 2", n)
	}
	_ = w
}

func testRetryZeroSurvivesCrash(t *testing.T, e *env) {
	job := &ap.Job{Type: "z", Policy: ap.Policy{RetryLimit: ap.Limit(0)}}
	e.enqueue(e.producer(), job)
	if !e.crashOnce(t, "z") {
		t.Fatalf("the first worker never got the job")
	}
	w := e.worker(e.config()).handle(t, "z", ok).start(t)
	// The dead worker's late "lease lost" may be recorded after the
	// success: look for the success anywhere.
	e.waitFor("the job to survive the crash", func() bool {
		for _, o := range e.rec.outcomes(job.ID) {
			if o.Outcome == ap.OutcomeSucceeded {
				return true
			}
		}
		return false
	})
	checkTries(t, e.rec.of(job.ID), [3]int{1, 0, 0}, [3]int{2, 0, 1})
	if len(e.dead(w.P)) != 0 {
		t.Errorf("a RetryLimit(0) job was dead-lettered after one crash")
	}
}

func poison(t *testing.T, e *env, limit int, policy ...ap.Policy) {
	bad := &ap.Job{Type: "poison"}
	e.enqueue(e.producer(), bad)
	for i := range limit + 1 {
		if !e.crashOnce(t, "poison", policy...) {
			t.Fatalf("crash %d: the worker never got the job", i+1)
		}
	}
	good := &ap.Job{Type: "good"}
	p := e.producer()
	e.enqueue(p, good)
	h, started, release := blocker()
	close(release)
	go func() {
		for range started {
		}
	}()
	w := e.worker(e.config()).handle(t, "poison", h, policy...).handle(t, "good", ok).start(t)
	dl := e.waitDead(w.P, 1)[0]
	e.waitFor("the good job", func() bool { return e.rec.count(good.ID) == 1 })
	if dl.Reason != ap.ReasonPoisoned || dl.Job.ID != bad.ID || dl.Job.Crashes != limit+1 || dl.Job.TryCount != limit+1 {
		t.Errorf("dead letter reason %q job %s crashes %d tries %d; want poisoned %s %d %d", dl.Reason, dl.Job.ID, dl.Job.Crashes, dl.Job.TryCount, bad.ID, limit+1, limit+1)
	}
	if n := e.rec.count(bad.ID); n != limit+1 {
		t.Errorf("the poison job was attempted %d times, want PoisonLimit+1 = %d", n, limit+1)
	}
	checkTries(t, e.rec.of(good.ID), [3]int{1, 0, 0})
}

func testPoison(t *testing.T, e *env) { poison(t, e, ap.DefaultPoisonLimit) }

func testPoisonPerType(t *testing.T, e *env) {
	poison(t, e, 1, ap.Policy{PoisonLimit: ap.Limit(1)})
}

func testProcessKill(t *testing.T, e *env) {
	if e.opts.SingleProcess != "" {
		t.Skipf("the backend declares it cannot share queues across processes: %s", e.opts.SingleProcess)
	}
	job := &ap.Job{Type: "k"}
	e.enqueue(e.producer(), job)
	c := e.spawn(t, 1, "")
	c.expect(t, "STARTED "+job.ID, e.opts.Wait)
	c.kill(t) // SIGKILL mid-job
	e.worker(e.config()).handle(t, "k", ok).start(t)
	e.waitFor("the killed process's job", func() bool { return e.rec.count(job.ID) == 1 })
	checkTries(t, e.rec.of(job.ID), [3]int{2, 0, 1})
}

// processKillChild is the worker process of the ProcessKill case: it
// takes one job, says so, and hangs until it is killed.
func processKillChild(t *testing.T, k *kid, _ string) {
	p := k.platform(ap.Config{
		Queues: map[string]ap.QueueConfig{k.queue: {Concurrency: 1, Prefetch: ap.Limit(0)}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	_ = p.Handle("k", func(ctx context.Context, j *ap.Job) error {
		say("STARTED %s %d", j.ID, j.TryCount)
		time.Sleep(2 * time.Minute) // the parent kills us long before
		return errors.New("the parent never killed this worker")
	})
	ctx, cancel := context.WithTimeout(context.Background(), k.opts.Wait)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	time.Sleep(2 * time.Minute)
}
