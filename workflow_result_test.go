package asyncplatform

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

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
