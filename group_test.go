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

type failingHeld struct {
	*memory.Backend
	queue string
	fail  atomic.Bool
	tries atomic.Int32
}

func (b *failingHeld) Enqueue(ctx context.Context, queue string, msgs []driver.Message) error {
	if queue == b.queue {
		b.tries.Add(1)
		if b.fail.Load() {
			return errors.New("the broker refused the write")
		}
	}
	return b.Backend.Enqueue(ctx, queue, msgs)
}

// A job of a paused group whose held copy cannot be written must be
// requeued (deferred, uncounted), not left unsettled to come back as a crash.
func TestParkFailureIsNoCrash(t *testing.T) {
	ctx := context.Background()
	br := memory.NewBroker()
	b := &failingHeld{Backend: br.Connect(), queue: HeldQueue("q", "g")}
	b.fail.Store(true)
	p, err := New(b, Config{Logger: quietLog, Lease: 2 * time.Second, Queues: map[string]QueueConfig{"q": {Concurrency: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	var crashes atomic.Int32
	var ran atomic.Int32
	_ = p.Handle("t", func(ctx context.Context, j *Job) error { crashes.Store(int32(j.Crashes)); ran.Add(1); return nil })
	if err := p.PauseGroup(ctx, "q", "g"); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	time.Sleep(2 * PausePoll)
	if err := p.Enqueue(ctx, &Job{Type: "t", Queue: "q", Group: "g"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a park attempt", func() bool { return b.tries.Load() > 0 })
	b.fail.Store(false)
	if _, err := p.ResumeGroup(ctx, "q", "g"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the job ran", func() bool { return ran.Load() > 0 })
	if c := crashes.Load(); c != 0 {
		t.Fatalf("the job ran with Crashes = %d after a failed park; want 0 (a failed park is requeued, deferred, uncounted)", c)
	}
}

// Failed parks are no crashes: they never poison a job that never ran.
func TestParkFailuresDoNotPoison(t *testing.T) {
	ctx := context.Background()
	br := memory.NewBroker()
	b := &failingHeld{Backend: br.Connect(), queue: HeldQueue("q", "g")}
	b.fail.Store(true)
	var dead atomic.Pointer[DeadLetter]
	cfg := Config{Logger: quietLog, Lease: 300 * time.Millisecond, Queues: map[string]QueueConfig{"q": {Concurrency: 1}}}
	cfg.Hooks.OnDeadLetter = func(_ context.Context, d DeadLetter) { dead.Store(&d) }
	p, err := New(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	_ = p.Handle("t", func(ctx context.Context, j *Job) error { ran.Add(1); return nil })
	_ = p.PauseGroup(ctx, "q", "g")
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	time.Sleep(2 * PausePoll)
	_ = p.Enqueue(ctx, &Job{Type: "t", Queue: "q", Group: "g"})
	waitUntil(t, "several failed parks", func() bool { return b.tries.Load() > int32(DefaultPoisonLimit)+1 })
	b.fail.Store(false)
	_, _ = p.ResumeGroup(ctx, "q", "g")
	waitUntil(t, "the job ended", func() bool { return ran.Load() > 0 || dead.Load() != nil })
	if d := dead.Load(); d != nil {
		t.Fatalf("a job that never ran was dead-lettered: reason %s, crashes %d (%d park attempts)", d.Reason, d.Job.Crashes, b.tries.Load())
	}
}
