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
