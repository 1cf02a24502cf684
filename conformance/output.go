package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/driver"
	"github.com/asyncplatform/asyncplatform/internal/outcomehook"
)

// outputQueue is the output queue of a case's queue.
func outputQueue(queue string) string { return queue + "-out" }

// withOutput is cfg with the case's queue reporting to its output queue.
func (e *env) withOutput(cfg ap.Config) ap.Config {
	qs := make(map[string]ap.QueueConfig, len(cfg.Queues))
	for name, q := range cfg.Queues {
		if name == e.queue {
			q.Output = outputQueue(e.queue)
		}
		qs[name] = q
	}
	cfg.Queues = qs
	return cfg
}

// reports collects the outcome reports a consumer of the output queue was
// handed.
type reports struct {
	mu   sync.Mutex
	all  []ap.OutcomeReport
	jobs []*ap.Job
}

func (r *reports) of(id string) []ap.OutcomeReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []ap.OutcomeReport
	for _, x := range r.all {
		if x.JobID == id {
			out = append(out, x)
		}
	}
	return out
}

func (r *reports) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.all)
}

// consumeOutput starts a worker of the output queue that records every
// report; it also removes the output queue at the end of the case. Call it
// before the case starts its own workers (clean-ups run last first).
func (e *env) consumeOutput(t *testing.T) *reports {
	out := outputQueue(e.queue)
	t.Cleanup(func() { e.deleteQueue(out) })
	r := &reports{}
	cfg := e.config()
	cfg.Queues = map[string]ap.QueueConfig{out: {Concurrency: 4}}
	e.worker(cfg).handle(t, ap.ReportType, func(_ context.Context, j *ap.Job) error {
		rep, err := ap.DecodeReport(j)
		if err != nil {
			t.Errorf("a job on the output queue is not a report: %v", err)
			return ap.Permanent(err)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.all = append(r.all, rep)
		r.jobs = append(r.jobs, j)
		return nil
	}).start(t)
	return r
}

// deleteQueue removes a queue the case made beside its own.
func (e *env) deleteQueue(name string) {
	b := e.backend()
	d, ok := b.(driver.QueueDeleter)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.DeleteQueue(ctx, name); err != nil {
		e.t.Errorf("deleting queue %s: %v", name, err)
	}
}

// testOutputOnePerJob: every job of a queue with an output queue that ends
// is reported there exactly once, with what ended it; retries and
// rejections are not ends.
func testOutputOnePerJob(t *testing.T, e *env) {
	got := e.consumeOutput(t)
	cfg := e.withOutput(e.config())
	cfg.WorkerName = "worker-" + e.queue
	var mu sync.Mutex
	failed := map[string]bool{}
	w := e.worker(cfg)
	w.handle(t, "ok", func(_ context.Context, j *ap.Job) error {
		j.SetResult([]byte("r-" + j.ID))
		return nil
	})
	w.handle(t, "perm", func(context.Context, *ap.Job) error { return ap.Permanent(errors.New("no such account")) })
	w.handle(t, "flaky", func(_ context.Context, j *ap.Job) error {
		mu.Lock()
		defer mu.Unlock()
		if !failed[j.ID] {
			failed[j.ID] = true
			return errors.New("not yet")
		}
		return nil
	})
	w.handle(t, "rejected", func(_ context.Context, j *ap.Job) error {
		if e.rec.count(j.ID) == 1 {
			return ap.Reject(errors.New("busy"))
		}
		return nil
	})
	var jobs []*ap.Job
	for range 4 {
		jobs = append(jobs, &ap.Job{Type: "ok", Headers: map[string]string{"trace": "t1"}})
	}
	for _, typ := range []string{"perm", "perm", "flaky", "flaky", "rejected", "unknown"} {
		jobs = append(jobs, &ap.Job{Type: typ})
	}
	e.enqueue(w.P, jobs...)
	w.start(t)
	e.waitFor(fmt.Sprintf("%d outcome reports", len(jobs)), func() bool { return got.len() >= len(jobs) })
	e.settle()
	for _, j := range jobs {
		rs := got.of(j.ID)
		if len(rs) == 0 {
			t.Errorf("job %s (%s): no report", j.ID, j.Type)
			continue
		}
		r := rs[len(rs)-1]
		if len(rs) > 1 {
			// A lease that lapsed (a crash counted) brings the job back after
			// its report was published: at least once, not a defect.
			if r.Crashes == 0 || r.Key != rs[0].Key {
				t.Errorf("job %s (%s): %d reports, want 1 (without a crash): %+v", j.ID, j.Type, len(rs), rs)
				continue
			}
			t.Logf("job %s: %d reports under one key: its lease lapsed after the first was published (a crash counted)%s", j.ID, len(rs), e.stallNote())
		}
		if r.Queue != e.queue || r.Type != j.Type || r.Worker != cfg.WorkerName || r.Key == "" || r.EndedAt.IsZero() || !r.EnqueuedAt.Equal(j.EnqueuedAt) {
			t.Errorf("job %s: report %+v; want its queue, type, key, times and the worker %q", j.ID, r, cfg.WorkerName)
		}
		switch j.Type {
		case "ok":
			if r.Outcome != ap.OutcomeSucceeded || string(r.Result) != "r-"+j.ID || r.ResultSize != len(r.Result) || r.TryCount != 1+r.Crashes || r.Headers["trace"] != "t1" {
				t.Errorf("job %s: report %+v; want succeeded with its result, 1 try, its headers", j.ID, r)
			}
		case "perm":
			if r.Outcome != ap.OutcomeDeadLettered || r.Reason != ap.ReasonPermanent || r.Error != ap.Permanent(errors.New("no such account")).Error() || r.Failures != 1 || r.TryCount != 1+r.Crashes {
				t.Errorf("job %s: report %+v; want dead_lettered permanent, the error, 1 failure", j.ID, r)
			}
		case "flaky":
			if r.Outcome != ap.OutcomeSucceeded || r.TryCount != 2+r.Crashes || r.Failures != 1 {
				t.Errorf("job %s: report %+v; want succeeded on try 2 with 1 failure (the retry is not an end)", j.ID, r)
			}
		case "rejected":
			if r.Outcome != ap.OutcomeSucceeded || r.Failures != 0 {
				t.Errorf("job %s: report %+v; want succeeded, uncounted (the rejection is not an end)", j.ID, r)
			}
		case "unknown":
			if r.Outcome != ap.OutcomeDeadLettered || r.Reason != ap.ReasonUnhandled || r.Error == "" {
				t.Errorf("job %s: report %+v; want dead_lettered unhandled, with why", j.ID, r)
			}
		}
	}
	got.mu.Lock()
	defer got.mu.Unlock()
	for i, j := range got.jobs {
		if j.ID != got.all[i].Key || j.Queue != outputQueue(e.queue) {
			t.Errorf("report job %s on %s, want its ID to be the report's key %s, on %s", j.ID, j.Queue, got.all[i].Key, outputQueue(e.queue))
		}
	}
}

// testOutputSurvivesKill: a worker process SIGKILLed after it published a
// job's report and before it acknowledged the job: the report is there
// (at least once, never lost), the job comes back and ends again, and every
// report of it carries the same key, for the consumer to deduplicate.
func testOutputSurvivesKill(t *testing.T, e *env) {
	if e.opts.SingleProcess != "" {
		t.Skipf("the backend declares it cannot share queues across processes: %s", e.opts.SingleProcess)
	}
	got := e.consumeOutput(t)
	job := &ap.Job{Type: "k"}
	e.enqueue(e.producer(), job)
	c := e.spawn(t, 1, "")
	c.expect(t, "PUBLISHED "+job.ID, e.opts.Wait)
	c.kill(t) // SIGKILL between the publish and the ack
	cfg := e.withOutput(e.config())
	var logged atomic.Int32 // leases the rerun's worker logged as lost
	cfg.Logger = slog.New(&lostLeases{dying: new(atomic.Bool), n: &logged})
	w := e.worker(cfg).handle(t, "k", resultK).start(t)
	e.waitFor("the killed process's job to run again and be reported", func() bool {
		return e.rec.count(job.ID) == 1 && len(got.of(job.ID)) >= 1 && len(e.rec.outcomes(job.ID)) == 1
	})
	e.settle()
	// The kill is the one crash; a lease the rerun's worker logged lost
	// before the attempt (a loaded machine: no attempt names it) is one
	// more, of the job's own.
	if at := e.rec.of(job.ID); len(at) == 1 && at[0].Failures == 0 && at[0].Crashes > 1 &&
		at[0].TryCount == 1+at[0].Crashes && at[0].Crashes-1 <= int(logged.Load()) {
		t.Logf("the rerun saw %d crashes: the kill and %d leases its worker logged lost", at[0].Crashes, at[0].Crashes-1)
	} else {
		checkTries(t, at, [3]int{2, 0, 1})
	}
	rs := got.of(job.ID)
	if len(rs) == 0 || len(rs) > 2 {
		t.Fatalf("%d reports of the job, want 1 or 2 (the killed worker's and the rerun's)", len(rs))
	}
	if len(rs) == 1 {
		t.Logf("one report: the backend dropped the second publish of key %s (it deduplicates message IDs)", rs[0].Key)
	}
	for _, r := range rs {
		if r.Key != rs[0].Key || r.Outcome != ap.OutcomeSucceeded || string(r.Result) != "k-"+job.ID {
			t.Errorf("report %+v; want succeeded with the result, every report of the job with the key %s", r, rs[0].Key)
		}
	}
	if rs[0].Crashes != 0 || !strings.HasPrefix(rs[0].Worker, "child-") {
		t.Errorf("the first report %+v; want the killed child's, with no crash", rs[0])
	}
	if st, err := w.P.Stats(ctxT(t, e.opts.Wait), e.queue); err == nil && (st.Ready > 0 || st.InFlight > 0) {
		t.Errorf("the input queue still holds the job after it ended again: %+v", st)
	}
}

func resultK(_ context.Context, j *ap.Job) error {
	j.SetResult([]byte("k-" + j.ID))
	return nil
}

// outputKillChild is the worker process of the OutputSurvivesKill case:
// it says when it has published its job's report and hangs there, before
// the job is acknowledged, until it is killed.
func outputKillChild(t *testing.T, k *kid, _ string) {
	queue := k.queue
	hang := func(q, id string) {
		if q != queue {
			return
		}
		say("PUBLISHED %s", id)
		time.Sleep(2 * time.Minute) // the parent kills us long before
	}
	outcomehook.Published.Store(&hang)
	p := k.platform(ap.Config{
		Queues:     map[string]ap.QueueConfig{queue: {Concurrency: 1, Prefetch: ap.Limit(0), Output: outputQueue(queue)}},
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		WorkerName: fmt.Sprintf("child-%d", os.Getpid()),
	})
	_ = p.Handle("k", resultK)
	ctx, cancel := context.WithTimeout(context.Background(), k.opts.Wait)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	time.Sleep(2 * time.Minute)
}

// testCancelFailsBeforePoll: a handler that returns an error just after
// its job was cancelled, before the worker's poll for cancellations could
// see it, is not retried: the job is dead-lettered as cancelled.
func testCancelFailsBeforePoll(t *testing.T, e *env) {
	started, release := make(chan struct{}, 1), make(chan struct{})
	cfg := e.tracking()
	cfg.Policy.RetryLimit = ap.Limit(5)
	w := e.worker(cfg).handle(t, "quick", func(context.Context, *ap.Job) error {
		started <- struct{}{}
		<-release
		return errors.New("gave up")
	}, ap.Policy{Timeout: time.Minute})
	job := &ap.Job{Type: "quick"}
	e.enqueue(w.P, job)
	w.start(t)
	select {
	case <-started:
	case <-time.After(e.opts.Wait):
		t.Fatal("the handler never started")
	}
	prod := e.worker(e.tracking()).P
	if err := prod.Cancel(ctxT(t, e.opts.Wait), job.ID); err != nil {
		close(release)
		t.Fatalf("Cancel: %v", err)
	}
	close(release) // at once: the poll (every ~300 ms) has most likely not run
	dl := e.waitDead(w.P, 1)[0]
	e.settle()
	if n := e.rec.count(job.ID); n != 1 || dl.Reason != ap.ReasonCancelled || dl.Job.Failures != 0 {
		t.Errorf("%d attempts, dead letter %q with %d failures; want 1 attempt, cancelled, uncounted", n, dl.Reason, dl.Job.Failures)
	}
	var st ap.JobStatus
	e.waitFor("the cancelled status", func() bool { st = e.status(prod, job.ID); return st.State == ap.StateCancelled })
}
