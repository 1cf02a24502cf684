package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	ap "github.com/asyncplatform/asyncplatform"
	"github.com/asyncplatform/asyncplatform/conformance/internal/reference"
)

// TestOutcomesInAttemptOrder: Hooks.AfterAttempt runs after the settle, so
// a retry's attempt can be reported before the attempt that wrote it (here
// forced: the first attempt's hook waits for the second's). The recorder
// still gives a job's outcomes in the order of its attempts, which the
// cases that wait for "the n-th outcome" read (TryCount/CountsUp,
// Outcome/Reject; on a loaded 3-node RabbitMQ cluster CountsUp timed out
// with 3 attempts and 3 outcomes recorded, the success among them).
func TestOutcomesInAttemptOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var rec recorder
	second := make(chan struct{})
	p, err := ap.New(reference.NewBroker("").Connect(), ap.Config{
		Queues: map[string]ap.QueueConfig{"q": {Concurrency: 2}},
		Policy: ap.Policy{BackoffBase: time.Millisecond, BackoffCap: time.Millisecond},
		Hooks: ap.Hooks{AfterAttempt: func(_ context.Context, a ap.Attempt) {
			if a.Outcome == ap.OutcomeRetried {
				select {
				case <-second:
				case <-ctx.Done():
				}
			}
			rec.attempted(a)
			if a.Outcome == ap.OutcomeSucceeded {
				close(second)
			}
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Handle("t", func(_ context.Context, j *ap.Job) error {
		if j.TryCount == 1 {
			return errors.New("first try")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(context.Background())
	job := &ap.Job{Type: "t", Queue: "q"}
	if err := p.Enqueue(ctx, job); err != nil {
		t.Fatal(err)
	}
	for len(rec.outcomes(job.ID)) < 2 {
		if ctx.Err() != nil {
			t.Fatalf("two outcomes not reported: %v", &rec)
		}
		time.Sleep(5 * time.Millisecond)
	}
	o := rec.outcomes(job.ID)
	if o[0].Outcome != ap.OutcomeRetried || o[1].Outcome != ap.OutcomeSucceeded {
		t.Errorf("outcomes %s, %s; want retried, succeeded (the attempts' order)\n%v", o[0].Outcome, o[1].Outcome, &rec)
	}
}

// TestFirstLifeHandler: a crash's line in the history does not count as the
// first life; only the handler's own dead-lettering does.
func TestFirstLifeHandler(t *testing.T) {
	for _, c := range []struct {
		name   string
		errors []string
		dead   bool
	}{
		{"a fresh job", nil, true},
		{"after a crash", []string{"try 1: no outcome (the worker died or lost its lease)"}, true},
		{"redriven", []string{"try 1 at 2026-11-30T12:00:00Z: first life"}, false},
		{"redriven after a crash", []string{"try 1: no outcome (the worker died or lost its lease)", "try 2 at 2026-11-30T12:00:00Z: first life"}, false},
	} {
		err := firstLifeHandler(context.Background(), &ap.Job{Errors: c.errors})
		var pe *ap.PermanentError
		if got := errors.As(err, &pe); got != c.dead {
			t.Errorf("%s: handler returned %v; want Permanent %v", c.name, err, c.dead)
		}
	}
}
