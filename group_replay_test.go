package asyncplatform

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestGroupHeldPastReplayWindow: a job of a paused group is held
// byte for byte (signed when it was set aside); resumed after more than
// ReplayWindow, it is dead-lettered as "bad signature" (a replay) instead
// of running.
func TestGroupHeldPastReplayWindow(t *testing.T) {
	var ran atomic.Int32
	cfg := Config{
		Queues:       map[string]QueueConfig{"q": {}},
		SigningKey:   []byte("0123456789abcdef0123456789abcdef"),
		ReplayWindow: time.Second,
	}
	p := startPlatform(t, cfg, map[string]Handler{"t": func(ctx context.Context, j *Job) error { ran.Add(1); return nil }})
	ctx := context.Background()
	if err := p.PauseGroup(ctx, "q", "g"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * PausePoll)
	if err := p.Enqueue(ctx, &Job{Type: "t", Queue: "q", Group: "g"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // held longer than the ReplayWindow
	if _, err := p.ResumeGroup(ctx, "q", "g"); err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(5 * time.Second)
	for ran.Load() == 0 && time.Now().Before(end) {
		page, err := p.DeadLetters(ctx, "q", "", 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Letters) > 0 {
			t.Fatalf("the resumed job was dead-lettered unrun: %s", page.Letters[0].Error)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ran.Load() == 0 {
		t.Fatal("the resumed job never ran")
	}
}
