package rabbit

import (
	"context"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/driver"
)

// TestReenqueueAfterFailedEnqueueRuns (review): an Enqueue fails after
// its message was stored (confirm swallowed, ctx ends); the stored job runs
// and is acked. The caller then enqueues a new job under the same ID (a
// new Job value, another body: contract.md §9 says only a retry with the
// same Job value is deduplicated). The new job must be handed out; the
// twin detection publishes it under the failed Enqueue's instance, which
// the worker remembers as run, and acks it unhanded: the job is lost.
func TestReenqueueAfterFailedEnqueueRuns(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testURL())
	if err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, u.Host)
	quiet := slog.New(slog.DiscardHandler)
	// One Backend that enqueues and works, as a platform uses it.
	b := newBackend(t, Config{URL: px.url(t, testURL()), Logger: quiet})
	ctx := testCtx(t)
	q := queueName(t, b)
	if err := b.Declare(ctx, q); err != nil {
		t.Fatal(err)
	}
	px.dropConfirms.Store(true)
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err = b.Enqueue(cctx, q, []driver.Message{{ID: "job-1", Body: []byte("first")}})
	cancel()
	if err == nil {
		t.Fatal("Enqueue succeeded with its confirm swallowed")
	}
	px.dropConfirms.Store(false)
	first, err := b.Receive(ctx, q, 1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if string(first[0].Body) != "first" {
		t.Fatalf("got %q", first[0].Body)
	}
	if err := b.Ack(ctx, first[0]); err != nil {
		t.Fatal(err)
	}

	// A new job under the same ID, with a body of its own.
	if err := b.Enqueue(ctx, q, []driver.Message{{ID: "job-1", Body: []byte("second")}}); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	again, err := b.Receive(rctx, q, 1, time.Minute)
	if err != nil {
		st, _ := b.Stats(ctx, q)
		t.Fatalf("a new job enqueued under the ID of a failed Enqueue whose message ran was never handed out (%v; Stats %+v): lost", err, st)
	}
	if string(again[0].Body) != "second" {
		t.Fatalf("got %q, want the new job", again[0].Body)
	}
	if err := b.Ack(ctx, again[0]); err != nil {
		t.Fatal(err)
	}
}
