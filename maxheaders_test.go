package asyncplatform

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// TestPlatformHeadersPastLimit: Enqueue counts a job's headers
// against MaxHeaders before the platform adds the status nonce (tracked
// queue) and the queue binding and signing time (SigningKey). At
// MaxHeaders = maxHeadersLimit (wire.MaxHeaders, which a worker decodes at
// most) a job Enqueue accepted reaches the worker with 3 more headers and
// is dead-lettered as not a job: it never runs.
func TestPlatformHeadersPastLimit(t *testing.T) {
	var ran atomic.Int32
	cfg := Config{
		Queues:     map[string]QueueConfig{"q": {TrackStatus: true}},
		MaxHeaders: maxHeadersLimit,
		SigningKey: []byte("0123456789abcdef0123456789abcdef"),
	}
	p := startPlatform(t, cfg, map[string]Handler{"t": func(ctx context.Context, j *Job) error { ran.Add(1); return nil }})
	h := make(map[string]string, maxHeadersLimit)
	for i := range maxHeadersLimit {
		h[fmt.Sprintf("h%04d", i)] = ""
	}
	if err := p.Enqueue(context.Background(), &Job{Type: "t", Queue: "q", Headers: h}); err != nil {
		t.Fatalf("Enqueue refused the job: %v", err)
	}
	end := time.Now().Add(5 * time.Second)
	for ran.Load() == 0 && time.Now().Before(end) {
		page, err := p.DeadLetters(context.Background(), "q", "", 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Letters) > 0 {
			t.Fatalf("a job Enqueue accepted was dead-lettered unrun: %s", page.Letters[0].Error)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ran.Load() == 0 {
		t.Fatal("the job never ran")
	}
}
