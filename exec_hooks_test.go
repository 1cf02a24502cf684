package asyncplatform

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// The fields hooks see for a job that fails permanently on a
// priority level, the handler having changed its own Job.
func TestHookFields(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var dl *DeadLetter
	var at *Attempt
	cfg := Config{Queues: map[string]QueueConfig{"q": {Priorities: true}}}
	cfg.Hooks.OnDeadLetter = func(_ context.Context, d DeadLetter) { mu.Lock(); dl = &d; mu.Unlock() }
	cfg.Hooks.AfterAttempt = func(_ context.Context, a Attempt) {
		mu.Lock()
		c := a
		j := *a.Job
		c.Job = &j
		at = &c
		mu.Unlock()
	}
	p := startPlatform(t, cfg, map[string]Handler{"t": func(ctx context.Context, j *Job) error {
		j.ID = "changed-by-handler"
		return Permanent(errors.New("no"))
	}})
	if err := p.Enqueue(ctx, &Job{Type: "t", Queue: "q", Priority: 2, Group: "g"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "hooks", func() bool { mu.Lock(); defer mu.Unlock(); return dl != nil && at != nil })
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("OnDeadLetter: Job.Queue=%q Job.Group=%q Job.Priority=%d Job.TryCount=%d Copy=%d ID=%s", dl.Job.Queue, dl.Job.Group, dl.Job.Priority, dl.Job.TryCount, dl.Job.CopyNumber(), dl.ID)
	t.Logf("AfterAttempt: Job.ID=%q Job.Queue=%q Job.Priority=%d TryCount=%d Outcome=%s Reason=%s", at.Job.ID, at.Job.Queue, at.Job.Priority, at.Job.TryCount, at.Outcome, at.Reason)
	if dl.Job.Priority != 2 {
		t.Errorf("OnDeadLetter's Job.Priority = %d, want 2", dl.Job.Priority)
	}
	if at.Job.ID == "changed-by-handler" {
		t.Errorf("AfterAttempt's Job.ID is the handler's change %q, not the job's", at.Job.ID)
	}
}
