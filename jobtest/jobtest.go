// Package jobtest helps test code that uses asyncplatform, without a broker:
// run one attempt of a handler through the platform's real decision logic
// and see its outcome (Work), simulate the worker crashes that came before
// it (Options.Crashes), run a workflow step with its dependencies' results
// (Options.DependencyResults), and check that code under test enqueued a job
// (Recorder).
package jobtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/internal/workflow"
)

// Result is what became of one attempt.
type Result struct {
	// Outcome is what the platform did with the attempt.
	Outcome asyncplatform.Outcome
	// Reason is the dead-letter reason, for OutcomeDeadLettered.
	Reason asyncplatform.Reason
	// Err is the handler's error (nil on success, and when the handler was
	// not called: a poisoned or expired job).
	Err error
	// RetryAt is when the job would be offered again, for a retry or a
	// rejection.
	RetryAt time.Time
	// Job is the job as the handler saw it (its counters included); for a
	// dead letter, the job as dead-lettered.
	Job *asyncplatform.Job
	// DeadLetter is the record, for OutcomeDeadLettered.
	DeadLetter *asyncplatform.DeadLetter
}

// Options adjust Work. The zero value runs the job as a fresh one under the
// default policies.
type Options struct {
	// Policy is the job type's policy, as given to Platform.Handle.
	Policy asyncplatform.Policy

	// Config is the platform's configuration: its Policy, RejectDelay,
	// Middleware and the like apply. Queues, Hooks, Logger and Lease are
	// Work's own.
	Config asyncplatform.Config

	// Crashes is how many deliveries of the job ended with no outcome
	// before this one (its worker was killed, ran out of memory or lost
	// the lease). Each counts as a crash, as it would on a broker: past the
	// poison limit the job is dead-lettered without calling the handler.
	Crashes int

	// DependencyResults, when not nil, runs the job as a workflow step
	// whose dependencies are the map's keys: Job.DependencyResult returns
	// each one's value (nil: a dependency that set no result, was skipped,
	// or failed under RunOnDependency), and an error for a step not in
	// the map, as it would for a step that is not a dependency. What the
	// step sets with Job.SetResult is Result.Job.Result(). Defaults to
	// nil: the job is no workflow step, and DependencyResult is an error.
	DependencyResults map[string][]byte
}

const crashLease = 20 * time.Millisecond

// Work runs one attempt of job through h, synchronously, with the
// platform's own decoding, policy resolution, decision and settling, on an
// in-memory backend, and returns what became of it. The job is enqueued
// first (its ID, Queue and EnqueuedAt are filled in); what the attempt
// writes next (a retry, a dead letter) is discarded with the backend.
func Work(ctx context.Context, h asyncplatform.Handler, job *asyncplatform.Job, opts Options) (Result, error) {
	if job == nil || h == nil {
		return Result{}, fmt.Errorf("jobtest: %w: Work needs a job and a handler", asyncplatform.ErrInvalidConfig)
	}
	b, err := memory.New(ctx, memory.Config{})
	if err != nil {
		return Result{}, err
	}
	defer b.Close()
	queue := job.Queue
	if queue == "" {
		queue = asyncplatform.DefaultQueue
	}
	done := make(chan Result, 2)
	cfg := opts.Config
	cfg.Queues = map[string]asyncplatform.QueueConfig{queue: {Concurrency: 1, Prefetch: asyncplatform.Limit(0)}}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Lease = 0
	cfg.Hooks = asyncplatform.Hooks{
		AfterAttempt: func(_ context.Context, a asyncplatform.Attempt) {
			if a.Outcome != asyncplatform.OutcomeDeadLettered { // OnDeadLetter reports those
				done <- Result{Outcome: a.Outcome, Err: a.Err, RetryAt: a.RetryAt, Job: a.Job}
			}
		},
		OnDeadLetter: func(_ context.Context, dl asyncplatform.DeadLetter) {
			r := Result{Outcome: asyncplatform.OutcomeDeadLettered, Reason: dl.Reason, Job: &dl.Job, DeadLetter: &dl}
			done <- r
		},
	}
	var handlerErr error
	var mu sync.Mutex
	deps := maps.Clone(opts.DependencyResults)
	wrapped := func(ctx context.Context, j *asyncplatform.Job) error {
		if deps != nil {
			ctx = workflow.WithResults(ctx, deps)
		}
		err := h(ctx, j)
		mu.Lock()
		handlerErr = err
		mu.Unlock()
		return err
	}
	p, err := asyncplatform.New(b, cfg)
	if err != nil {
		return Result{}, err
	}
	if err := p.Handle(job.Type, wrapped, opts.Policy); err != nil {
		return Result{}, err
	}
	if err := p.Enqueue(ctx, job); err != nil {
		return Result{}, err
	}
	for i := range opts.Crashes {
		// A delivery whose lease lapses with no outcome is a crash.
		ds, err := b.Receive(ctx, queue, 1, crashLease)
		if err != nil || len(ds) != 1 {
			return Result{}, fmt.Errorf("jobtest: simulating crash %d: %d deliveries, %v", i+1, len(ds), err)
		}
		select {
		case <-time.After(2 * crashLease):
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
	}
	if err := p.Start(ctx); err != nil {
		return Result{}, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = p.Stop(sctx)
	}()
	select {
	case r := <-done:
		if r.Outcome == asyncplatform.OutcomeDeadLettered {
			mu.Lock()
			r.Err = handlerErr
			mu.Unlock()
		}
		return r, nil
	case <-ctx.Done():
		return Result{}, fmt.Errorf("jobtest: waiting for the attempt: %w", ctx.Err())
	}
}

// Recorder records the jobs enqueued through a platform: add
// Recorder.Middleware to Config.EnqueueMiddleware. It is safe for concurrent
// use.
type Recorder struct {
	mu   sync.Mutex
	jobs []asyncplatform.Job
}

// Middleware records each job that is then enqueued without error.
func (r *Recorder) Middleware() asyncplatform.EnqueueMiddleware {
	return func(next asyncplatform.EnqueueFunc) asyncplatform.EnqueueFunc {
		return func(ctx context.Context, jobs []*asyncplatform.Job) error {
			if err := next(ctx, jobs); err != nil {
				return err
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			for _, j := range jobs {
				r.jobs = append(r.jobs, *j)
			}
			return nil
		}
	}
}

// Jobs returns the jobs recorded so far, in order.
func (r *Recorder) Jobs() []asyncplatform.Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]asyncplatform.Job(nil), r.jobs...)
}

// ErrNotEnqueued is returned by Enqueued when no job of the type was
// recorded.
var ErrNotEnqueued = errors.New("no such job was enqueued")

// Enqueued returns the last recorded job of the given type, or an error
// wrapping ErrNotEnqueued that lists the types it did see.
func (r *Recorder) Enqueued(jobType string) (*asyncplatform.Job, error) {
	jobs := r.Jobs()
	var seen []string
	for i := len(jobs) - 1; i >= 0; i-- {
		if jobs[i].Type == jobType {
			return &jobs[i], nil
		}
		seen = append(seen, jobs[i].Type)
	}
	return nil, fmt.Errorf("jobtest: %w: type %q (enqueued: %q)", ErrNotEnqueued, jobType, seen)
}

// RequireEnqueued fails the test unless a job of the given type was
// enqueued, and returns the last one.
func RequireEnqueued(t testing.TB, r *Recorder, jobType string) *asyncplatform.Job {
	t.Helper()
	j, err := r.Enqueued(jobType)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// RequireEnqueuedJSON is RequireEnqueued that also decodes the job's JSON
// payload into T.
func RequireEnqueuedJSON[T any](t testing.TB, r *Recorder, jobType string) T {
	t.Helper()
	j := RequireEnqueued(t, r, jobType)
	var v T
	if err := json.Unmarshal(j.Payload, &v); err != nil {
		t.Fatalf("jobtest: job %s of type %q: decoding its payload as %T: %v", j.ID, jobType, v, err)
	}
	return v
}
