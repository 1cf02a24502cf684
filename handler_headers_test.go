package asyncplatform

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/internal/wire"
)

// A handler's Job.Headers are its own: a handler that deletes or rewrites
// the platform's headers (the unique claim) leaves the claim's release as
// it would be, and the output report carries the headers as enqueued,
// without the platform's enqueue nonce.
func TestHandlerHeadersAreItsOwn(t *testing.T) {
	t.Parallel()
	for _, track := range []bool{false, true} {
		t.Run(map[bool]string{false: "Untracked", true: "TrackStatus"}[track], func(t *testing.T) {
			t.Parallel()
			testHandlerHeaders(t, track)
		})
	}
}

func testHandlerHeaders(t *testing.T, track bool) {
	p, err := New(memory.NewBroker().Connect(), Config{
		Logger:      quietLog,
		TrackStatus: track,
		Queues:      map[string]QueueConfig{"in": {Output: "out"}, "out": {}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int32
	if err := p.Handle("t", func(ctx context.Context, j *Job) error {
		defer handled.Add(1)
		if _, ok := j.Headers[wire.StatusHeader]; ok {
			t.Errorf("the handler sees the enqueue nonce %s", wire.StatusHeader)
		}
		delete(j.Headers, UniqueHeader)
		j.Headers["k"] = "changed"
		j.Headers["added"] = "by the handler"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	reports := collect(t, p)
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	if err := p.Enqueue(ctx, &Job{Type: "t", Queue: "in", UniqueKey: "u", Headers: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the report", func() bool { return len(reports()) == 1 })
	for range 200 { // the release follows the outcome's report
		if err = p.Enqueue(ctx, &Job{Type: "t", Queue: "in", UniqueKey: "u"}); !errors.Is(err, ErrDuplicate) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("the key after its job succeeded, the handler having deleted the claim's header: %v; want it released", err)
	}
	r := reports()[0]
	if r.Headers["k"] != "v" || r.Headers["added"] != "" {
		t.Errorf("the report's headers %v; want the job's as enqueued (k=v, nothing added)", r.Headers)
	}
	if _, ok := r.Headers[wire.StatusHeader]; ok {
		t.Errorf("the report carries the enqueue nonce %s", wire.StatusHeader)
	}
	waitUntil(t, "the second job", func() bool { return handled.Load() == 2 })
}
