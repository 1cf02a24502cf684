package status

import (
	"context"
	"testing"
	"time"
)

// A job's end from another enqueue (a copy from before a redrive, or a
// forged one), waiting to be written, does not take the place of the end
// of the job's delivery that follows it: the record decides between them,
// and keeps the end of its own enqueue.
func TestEndOfAnotherEnqueueKeepsTheRecordsEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &batcher{Store: newStore(t)}
	tk, other := newTracker(b, "w1"), newTracker(b, "w2")
	busy := Job{ID: "busy", Queue: "q", Type: "t", Nonce: "n"}
	j := Job{ID: "j1", Queue: "q", Type: "t", Nonce: "n2"} // the job's life the record is for
	tk.Enqueued(ctx, []Job{busy})
	tk.Enqueued(ctx, []Job{j})
	open := b.shut()
	settle(t, tk, busy) // the writer takes it and waits: the next ends wait together
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		b.mu.Lock()
		taken := len(b.getEach) > 0
		b.mu.Unlock()
		if taken {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the writer did not take the first end")
		}
	}
	stale := j
	stale.Nonce = "n1" // a copy from before the redrive
	settle(t, tk, stale)
	settle(t, tk, j)
	open()
	flush(t, tk)
	if r := get(t, other, "j1"); r.State != Succeeded || r.Nonce != "n2" {
		t.Errorf("after the stale copy's end then the job's: %+v; want succeeded, nonce n2", r)
	}
}
