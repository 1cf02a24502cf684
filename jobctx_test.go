package asyncplatform

import (
	"context"
	"errors"
	"sync"
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
	p, _ := New(memory.New(), Config{
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

// TestJobContextAfterFunc checks the AfterFunc contract the context package
// relies on: callbacks run once on cancel, a stopped one never runs, and one
// registered after the cancel runs at once.
func TestJobContextAfterFunc(t *testing.T) {
	c := &jobContext{parent: context.Background()}
	var wg sync.WaitGroup
	ran := make(chan string, 3)
	wg.Add(2)
	c.AfterFunc(func() { ran <- "a"; wg.Done() })
	stop := c.AfterFunc(func() { ran <- "stopped" })
	if !stop() || stop() {
		t.Error("stop: want true once, then false")
	}
	c.cancel(context.Canceled)
	c.cancel(context.DeadlineExceeded) // only the first counts
	if late := c.AfterFunc(func() { ran <- "late"; wg.Done() }); late() {
		t.Error("stop after the cancel returned true")
	}
	wg.Wait()
	close(ran)
	var got []string
	for s := range ran {
		got = append(got, s)
	}
	if len(got) != 2 || (got[0] != "a" && got[1] != "a") || (got[0] != "late" && got[1] != "late") {
		t.Errorf("ran %v, want a and late", got)
	}
	if !errors.Is(c.Err(), context.Canceled) {
		t.Errorf("Err() = %v, want context.Canceled", c.Err())
	}
	select {
	case <-c.Done():
	default:
		t.Error("Done() not closed after cancel")
	}
}
