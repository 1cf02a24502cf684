package asyncplatform

import (
	"context"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// TestReviewReportHeadersNoNonce: the enqueue nonce is the platform's and
// is left out of the handler's Job.Headers (contract, status); an
// OutcomeReport's Headers are "the input job's headers", yet they carry
// the nonce to every reader of the output queue.
func TestReviewReportHeadersNoNonce(t *testing.T) {
	p, err := New(memory.NewBroker().Connect(), Config{
		Logger: quietLog,
		Queues: map[string]QueueConfig{"in": {Concurrency: 1, Output: "out", TrackStatus: true}, "out": {}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var seen map[string]string
	if err := p.Handle("t", func(_ context.Context, j *Job) error { seen = j.Headers; return nil }); err != nil {
		t.Fatal(err)
	}
	got := collect(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Enqueue(ctx, &Job{Type: "t", Queue: "in", Headers: map[string]string{"trace": "x"}}); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop(context.Background()) }()
	for len(got()) == 0 {
		if ctx.Err() != nil {
			t.Fatal("no report")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, ok := seen[wire.StatusHeader]; ok {
		t.Fatalf("the handler saw the nonce: %v", seen)
	}
	if r := got()[0]; r.Headers[wire.StatusHeader] != "" {
		t.Errorf("the report's Headers carry the input's enqueue nonce %q to the output queue's readers (the handler's Headers do not): %v", r.Headers[wire.StatusHeader], r.Headers)
	}
}
