package asyncplatform

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
)

// TestHandlerContext checks the handler's context on one worker: a job with
// a long timeout followed by one with a short timeout (the worker's timer,
// armed for the first, must be brought forward), a context derived in the
// handler (cancelled with it), and the context being cancelled once the
// handler returns.
func TestHandlerContext(t *testing.T) {
	type result struct {
		err, derived error
		deadline     bool
		kept         context.Context
	}
	got := make(chan result, 2)
	p, _ := New(memory.NewBroker().Connect(), Config{
		Logger: quietLog,
		Queues: map[string]QueueConfig{DefaultQueue: {Concurrency: 1}},
		Policy: Policy{RetryLimit: Limit(0)},
	})
	_ = p.Handle("long", func(ctx context.Context, _ *Job) error {
		_, ok := ctx.Deadline()
		got <- result{deadline: ok, kept: ctx}
		return nil
	}, Policy{Timeout: time.Hour})
	_ = p.Handle("short", func(ctx context.Context, _ *Job) error {
		d, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		<-d.Done()
		_, ok := ctx.Deadline()
		got <- result{err: context.Cause(ctx), derived: context.Cause(d), deadline: ok, kept: ctx}
		return ctx.Err()
	}, Policy{Timeout: 50 * time.Millisecond})
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { // bounded: a handler whose timeout is not enforced runs an hour
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_ = p.Stop(sctx)
	}()
	if err := p.EnqueueBatch(ctx, []*Job{{Type: "long"}, {Type: "short"}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"long", "short"} {
		var r result
		select {
		case r = <-got:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the handler never returned: its timeout was not enforced", name)
		}
		if !r.deadline {
			t.Errorf("%s: ctx.Deadline reports none", name)
		}
		if name == "short" && (!errors.Is(r.err, context.DeadlineExceeded) || !errors.Is(r.derived, context.DeadlineExceeded)) {
			t.Errorf("short: context.Cause = %v, of a derived context %v; want context.DeadlineExceeded for both", r.err, r.derived)
		}
		select {
		case <-r.kept.Done():
		case <-time.After(10 * time.Second):
			t.Errorf("%s: the handler's context was not cancelled after it returned", name)
		}
	}
}
