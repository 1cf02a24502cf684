package jobtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/jobtest"
)

func TestWorkOutcomes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cases := []struct {
		name       string
		err        error
		opts       jobtest.Options
		want       asyncplatform.Outcome
		wantReason asyncplatform.Reason
		wantTry    int
	}{
		{name: "ok", want: asyncplatform.OutcomeSucceeded, wantTry: 1},
		{name: "error", err: errors.New("boom"), want: asyncplatform.OutcomeRetried, wantTry: 1},
		{name: "error at the limit", err: errors.New("boom"), opts: jobtest.Options{Policy: asyncplatform.Policy{RetryLimit: asyncplatform.Limit(0)}},
			want: asyncplatform.OutcomeDeadLettered, wantReason: asyncplatform.ReasonRetriesExceeded, wantTry: 1},
		{name: "permanent", err: asyncplatform.Permanent(errors.New("no")), want: asyncplatform.OutcomeDeadLettered, wantReason: asyncplatform.ReasonPermanent, wantTry: 1},
		{name: "reject", err: asyncplatform.Reject(errors.New("later")), want: asyncplatform.OutcomeRejected, wantTry: 1},
		{name: "after two crashes", opts: jobtest.Options{Crashes: 2}, want: asyncplatform.OutcomeSucceeded, wantTry: 3},
		{name: "poisoned", opts: jobtest.Options{Crashes: 2, Policy: asyncplatform.Policy{PoisonLimit: asyncplatform.Limit(1)}},
			want: asyncplatform.OutcomeDeadLettered, wantReason: asyncplatform.ReasonPoisoned, wantTry: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			called := 0
			r, err := jobtest.Work(ctx, func(ctx context.Context, j *asyncplatform.Job) error {
				called++
				return c.err
			}, &asyncplatform.Job{Type: "t"}, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			if r.Outcome != c.want || r.Reason != c.wantReason {
				t.Errorf("got %s %q, want %s %q", r.Outcome, r.Reason, c.want, c.wantReason)
			}
			if r.Job == nil || r.Job.TryCount != c.wantTry {
				t.Errorf("job %+v, want TryCount %d", r.Job, c.wantTry)
			}
			if c.wantReason == asyncplatform.ReasonPoisoned && called != 0 {
				t.Errorf("a poisoned job's handler ran %d times", called)
			}
			if c.err != nil && !errors.Is(r.Err, c.err) {
				t.Errorf("Err = %v, want %v", r.Err, c.err)
			}
		})
	}
}

func TestRecorder(t *testing.T) {
	ctx := context.Background()
	b, _ := memory.New(ctx, memory.Config{})
	var rec jobtest.Recorder
	p, err := asyncplatform.New(b, asyncplatform.Config{EnqueueMiddleware: []asyncplatform.EnqueueMiddleware{rec.Middleware()}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rec.Enqueued("email"); !errors.Is(err, jobtest.ErrNotEnqueued) {
		t.Fatalf("nothing enqueued yet: %v", err)
	}
	j, _ := asyncplatform.NewJSONJob("email", map[string]string{"to": "a@example.com"})
	if err := p.Enqueue(ctx, j); err != nil {
		t.Fatal(err)
	}
	if err := p.Enqueue(ctx, &asyncplatform.Job{}); err == nil {
		t.Fatal("a job with no type was enqueued")
	}
	got := jobtest.RequireEnqueuedJSON[map[string]string](t, &rec, "email")
	if got["to"] != "a@example.com" {
		t.Errorf("payload %v", got)
	}
	if n := len(rec.Jobs()); n != 1 {
		t.Errorf("recorded %d jobs, want 1 (a refused job is not recorded)", n)
	}
}

// TestWorkDependencyResults: Options.DependencyResults is what
// Job.DependencyResult returns; a step not in it, and any step without
// it, is an error.
func TestWorkDependencyResults(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	read := func(step string, got *[]byte, gotErr *error) asyncplatform.Handler {
		return func(ctx context.Context, j *asyncplatform.Job) error {
			*got, *gotErr = j.DependencyResult(ctx, step)
			return nil
		}
	}
	deps := map[string][]byte{"a": []byte("A"), "skipped": nil}
	for _, tc := range []struct {
		step    string
		deps    map[string][]byte
		want    string
		wantErr bool
	}{
		{step: "a", deps: deps, want: "A"},
		{step: "skipped", deps: deps, want: ""},
		{step: "b", deps: deps, wantErr: true},
		{step: "a", deps: nil, wantErr: true},
	} {
		var got []byte
		var err error
		if _, werr := jobtest.Work(ctx, read(tc.step, &got, &err), &asyncplatform.Job{Type: "t"}, jobtest.Options{DependencyResults: tc.deps}); werr != nil {
			t.Fatal(werr)
		}
		if (err != nil) != tc.wantErr || string(got) != tc.want {
			t.Errorf("DependencyResult(%q) with %v = %q, %v; want %q, error %v", tc.step, tc.deps, got, err, tc.want, tc.wantErr)
		}
	}
}
