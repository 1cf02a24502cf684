package asyncplatform

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// TestWorkflowStepResultTooLarge: a step whose handler succeeds with a
// result its record cannot hold is not run again (retrying cannot make it
// fit): it is dead-lettered once, permanent, and its workflow records it
// failed.
func TestWorkflowStepResultTooLarge(t *testing.T) {
	var runs atomic.Int32
	p := startPlatform(t, Config{}, map[string]Handler{"big": func(_ context.Context, j *Job) error {
		runs.Add(1)
		j.SetResult(make([]byte, driver.MaxValueLen))
		return nil
	}})
	ctx := context.Background()
	w := NewWorkflow("big").Add("a", &Job{Type: "big", Policy: Policy{RetryLimit: Limit(3), BackoffBase: time.Millisecond, BackoffCap: time.Millisecond}})
	if err := p.EnqueueWorkflow(ctx, w); err != nil {
		t.Fatal(err)
	}
	var st WorkflowStatus
	waitUntil(t, "the step to end", func() bool {
		var err error
		st, err = p.WorkflowStatus(ctx, w.ID)
		if err != nil {
			t.Fatal(err)
		}
		return st.Done()
	})
	if a, _ := st.Step("a"); a.State != "failed" || a.Reason != ReasonPermanent || runs.Load() != 1 {
		t.Errorf("step a %s/%s after %d runs; want failed/permanent after one run", a.State, a.Reason, runs.Load())
	}
}

// failingRoots is a memory backend, with its store, whose Enqueue to one
// queue fails.
type failingRoots struct {
	driver.Backend
	queue string
}

func (b *failingRoots) Store() (driver.Store, error) { return driver.StoreOf(b.Backend) }

func (b *failingRoots) Enqueue(ctx context.Context, queue string, msgs []driver.Message) error {
	if queue == b.queue {
		return errors.New("the broker refused the write")
	}
	return b.Backend.Enqueue(ctx, queue, msgs)
}

// TestWorkflowEnqueueFailsPartway: when the first steps' enqueue fails
// after the workflow was stored, EnqueueWorkflow's error leaves w.ID set,
// so the caller can read the workflow and cancel it before enqueueing it
// again.
func TestWorkflowEnqueueFailsPartway(t *testing.T) {
	ctx := context.Background()
	p, err := New(&failingRoots{Backend: memory.NewBroker().Connect(), queue: "bad"}, Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	w := NewWorkflow("partway").
		Add("a", &Job{Type: "t", Queue: "ok"}).
		Add("b", &Job{Type: "t", Queue: "bad"}).
		Add("c", &Job{Type: "t", Queue: "ok"}, "a", "b")
	if err := p.EnqueueWorkflow(ctx, w); err == nil {
		t.Fatal("EnqueueWorkflow with a refused first step: no error")
	}
	if w.ID == "" {
		t.Fatal("EnqueueWorkflow failed partway and left no ID: the caller cannot cancel what it started")
	}
	if _, err := p.WorkflowStatus(ctx, w.ID); err != nil {
		t.Errorf("WorkflowStatus of the half-enqueued workflow: %v", err)
	}
	if err := p.CancelWorkflow(ctx, w.ID); err != nil {
		t.Errorf("CancelWorkflow of the half-enqueued workflow: %v", err)
	}
	st, err := p.WorkflowStatus(ctx, w.ID)
	if err != nil || !st.Cancelled {
		t.Errorf("after CancelWorkflow: %+v, %v; want it cancelled", st, err)
	}
}
