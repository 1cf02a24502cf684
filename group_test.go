package asyncplatform

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// flakyStore is a memory connection whose store List fails while down is set.
type flakyStore struct {
	*memory.Backend
	down atomic.Bool
}

func (f *flakyStore) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	if f.down.Load() {
		return nil, errors.New("store unreachable")
	}
	return f.Backend.List(ctx, prefix, after, limit)
}

// TestGroupNotStrandedByFailingPolls: a worker whose pause polls fail (its
// view of the paused groups is stale) reads the pause again before it sets
// a job aside, so a resumed group's jobs run instead of waiting on the held
// queue with no pause in force. (Found by review.)
func TestGroupNotStrandedByFailingPolls(t *testing.T) {
	ctx := context.Background()
	br := memory.NewBroker()
	wb := &flakyStore{Backend: br.Connect()}
	w, err := New(wb, Config{Logger: quietLog, Queues: map[string]QueueConfig{"q": {}}})
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	_ = w.Handle("t", func(ctx context.Context, j *Job) error { ran.Add(1); return nil })
	admin, _ := New(br.Connect(), Config{Logger: quietLog})
	if err := admin.PauseGroup(ctx, "q", "g"); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx)
	wb.down.Store(true) // the worker's store reads fail for a while
	n, err := admin.ResumeGroup(ctx, "q", "g")
	t.Logf("ResumeGroup = %d, %v", n, err)
	for range 5 {
		_ = admin.Enqueue(ctx, &Job{Type: "t", Queue: "q", Group: "g"})
	}
	time.Sleep(time.Second)
	wb.down.Store(false) // the store is back
	time.Sleep(3 * PausePoll)
	g, _ := admin.PausedGroups(ctx, "q")
	st, _ := admin.Stats(ctx, HeldQueue("q", "g"))
	t.Logf("after recovery: paused groups %q, ran %d, held queue %+v", g, ran.Load(), st)
	if ran.Load() != 5 {
		t.Errorf("%d of 5 jobs of a resumed group ran; %d wait on %s with no pause in force", ran.Load(), st.Ready, HeldQueue("q", "g"))
	}
}
