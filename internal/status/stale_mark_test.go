package status

import (
	"context"
	"errors"
	"testing"

	"github.com/asyncplatform/asyncplatform/internal/jobctx"
)

// A cancel mark left by an earlier life of the job (its end's write, which
// deletes the mark, lost; the job then redriven: another nonce) cancels
// nothing of the job's next life: not at Begin, not at a poll while its
// handler runs, and not a failure at its end.
func TestStaleMarkCancelsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tk := newTracker(newStore(t), "w1")
	j := Job{ID: "j1", Queue: "q", Type: "t", Nonce: "n1"}
	tk.Enqueued(ctx, []Job{j})
	if err := tk.Cancel(ctx, "j1"); err != nil {
		t.Fatal(err)
	}
	j.Nonce = "n2" // redriven: the enqueue replaces the record, the mark stays
	tk.Enqueued(ctx, []Job{j})
	tr, cancelled := tk.Begin(ctx, j)
	if tr == nil || cancelled {
		t.Fatalf("Begin of the next life: %v, cancelled %v; want a track, not cancelled", tr, cancelled)
	}
	if tr.Running(ctx) {
		t.Fatal("Running of the next life: cancelled")
	}
	hctx := &jobctx.Context{Parent: ctx}
	tr.Started(hctx)
	tk.pollOnce(ctx)
	if err := context.Cause(hctx); errors.Is(err, ErrCancelled) {
		t.Errorf("a poll cancelled the next life's handler: %v", err)
	}
	if tr.Ended(ctx, true) {
		t.Error("the next life's failure was taken for a cancellation")
	}
}
