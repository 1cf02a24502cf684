package workflow

import (
	"context"
	"testing"
)

// TestConcurrentHolderCopiesEnqueueTwice documents (does not fail) how a
// join gets two copies in its queue with no kill: two deliveries of the
// same last parent at once (a lease lost under load) both pass the claim
// (it holds the parent's name) while the join is still recorded waiting,
// and both enqueue it. On a backend that does not drop a repeated job ID,
// the join is then started twice on a first delivery.
func TestConcurrentHolderCopiesEnqueueTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := &queue{}
	var e *Engine
	var id string
	nested := false
	enqueue := func(ctx context.Context, r []Ready) error {
		if err := q.enqueue(ctx, r); err != nil {
			return err
		}
		if !nested && len(r) == 1 && r[0].Step == "j" {
			nested = true // the other copy of b ends now, before j is recorded enqueued
			if err := e.Advance(ctx, id, "b"); err != nil {
				t.Error(err)
			}
		}
		return nil
	}
	e = New(Config{Store: newFake(), Enqueue: enqueue})
	id = NewID()
	if err := e.Create(ctx, id, "", []Spec{spec("a"), spec("b"), spec("j", "a", "b")}); err != nil {
		t.Fatal(err)
	}
	q.take()
	for _, s := range []string{"a", "b"} {
		if err := e.Succeed(ctx, id, s, nil); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for _, r := range q.take() {
		if r.Step == "j" {
			n++
		}
	}
	t.Logf("j enqueued %d times by two concurrent copies of its last parent", n)
}
