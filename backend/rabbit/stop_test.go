package rabbit

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform"
)

// TestStopThenCloseUncounted is the SIGTERM path of a worker: Stop with
// handlers still running (they are handed back), then Close. Messages the
// broker pushed into the consumer's buffer meanwhile (the hand-back frees
// the prefetch window) were never handed out, and must come back uncounted.
func TestStopThenCloseUncounted(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.DiscardHandler)
	b1 := newBackend(t, Config{Logger: quiet})
	q := queueName(t, b1)
	ctx := testCtx(t)
	cfg := asyncplatform.Config{Queues: map[string]asyncplatform.QueueConfig{q: {Concurrency: 4, Prefetch: asyncplatform.Limit(0)}}, Logger: quiet, Lease: time.Second}
	p1, err := asyncplatform.New(b1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan string, 8)
	p1.Handle("s", func(ctx context.Context, j *asyncplatform.Job) error {
		started <- j.ID
		<-ctx.Done()
		return ctx.Err()
	})
	var jobs []*asyncplatform.Job
	for i := range 8 {
		jobs = append(jobs, &asyncplatform.Job{ID: fmt.Sprint("j", i), Type: "s", Queue: q})
	}
	if err := p1.EnqueueBatch(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	if err := p1.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		<-started
	}
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	p1.Stop(sctx)
	cancel()
	b1.Close()

	b2 := newBackend(t, Config{Logger: quiet})
	seen := 0
	for seen < 8 {
		ds, err := b2.Receive(ctx, q, 8, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			seen++
			if d.Deliveries != 1 {
				t.Errorf("a message came back with Deliveries %d after Stop and Close, want 1: %.80q", d.Deliveries, d.Body)
			}
			b2.Ack(ctx, d)
		}
	}
}
