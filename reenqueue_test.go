package asyncplatform

import (
	"context"
	"fmt"
	"testing"
)

// TestReenqueueDeliveredAtMaxHeaders: a job enqueued with
// MaxHeaders headers into a tracked queue, signed, is delivered carrying
// the platform's 3 headers besides; enqueueing it again from its handler,
// as delivered, is refused with a *LimitError (MaxHeaders), though the
// caller added nothing.
func TestReenqueueDeliveredAtMaxHeaders(t *testing.T) {
	errc := make(chan error, 1)
	var p *Platform
	cfg := Config{
		Queues:     map[string]QueueConfig{"q": {TrackStatus: true}, "r": {}},
		SigningKey: []byte("0123456789abcdef0123456789abcdef"),
	}
	p = startPlatform(t, cfg, map[string]Handler{"t": func(ctx context.Context, j *Job) error {
		if j.Queue == "q" {
			j.Queue = "r"
			errc <- p.Enqueue(ctx, j)
		}
		return nil
	}})
	h := make(map[string]string, DefaultMaxHeaders)
	for i := range DefaultMaxHeaders {
		h[fmt.Sprintf("h%03d", i)] = ""
	}
	if err := p.Enqueue(context.Background(), &Job{Type: "t", Queue: "q", Headers: h}); err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	if err := <-errc; err != nil {
		t.Errorf("enqueueing the delivered job again: %v", err)
	}
}
