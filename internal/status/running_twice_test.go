package status

import (
	"context"
	"errors"
	"testing"

	"github.com/asyncplatform/asyncplatform/internal/jobctx"
)

// A Cancel reaches the job's delivery running here while another delivery
// of the same job ID runs here too (a copy from before a redrive, a
// forged one, a duplicate), whichever started last; and the deliveries,
// once ended, leave no job counted as running.
func TestCancelReachesEveryDeliveryOfTheJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tk := newTracker(newStore(t), "w1")
	j := Job{ID: "j1", Queue: "q", Type: "t", Nonce: "n2"}
	tk.Enqueued(ctx, []Job{j})
	tr := deliver(t, tk, j)
	hctx := &jobctx.Context{Parent: ctx}
	tr.Started(hctx)
	stale := j
	stale.Nonce = "n1" // a copy from before a redrive
	str := deliver(t, tk, stale)
	str.Started(&jobctx.Context{Parent: ctx})
	if err := tk.Cancel(ctx, "j1"); err != nil {
		t.Fatal(err)
	}
	tk.pollOnce(ctx)
	if !errors.Is(context.Cause(hctx), ErrCancelled) {
		t.Errorf("after Cancel and a poll, the job's handler context is %v, want ErrCancelled", context.Cause(hctx))
	}
	str.Ended(ctx, false)
	tr.Ended(ctx, false)
	if n := tk.n.Load(); n != 0 {
		t.Errorf("%d jobs counted as running after both ended, want 0", n)
	}
}
