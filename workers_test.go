package asyncplatform

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// A started platform is listed by Workers on another platform of the same
// store, and leaves the list at Stop.
func TestWorkersListedUntilStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := memory.NewBroker()
	w, err := New(broker.Connect(), Config{Logger: quietLog, WorkerName: "w1", WorkerHeartbeat: time.Hour,
		Queues: map[string]QueueConfig{"a": {Concurrency: 3}, "b": {Concurrency: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	ops, err := New(broker.Connect(), Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var got []WorkerInfo
	waitUntil(t, "the worker's record", func() bool {
		got, err = ops.Workers(ctx)
		return err == nil && len(got) == 1
	})
	g := got[0]
	if g.Name != "w1" || g.Concurrency != 5 || len(g.Queues) != 2 || g.Queues[0] != "a" || g.PID == 0 || g.StartedAt.IsZero() || g.Heartbeat != time.Hour || g.Version == "" {
		t.Fatalf("worker %+v", g)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	if got, err := ops.Workers(ctx); err != nil || len(got) != 0 {
		t.Fatalf("after Stop: %d workers, %v; want none", len(got), err)
	}
}

// The attempts a worker runs are in History once it has flushed (at Stop
// at the latest), counted by queue, type and outcome.
func TestHistoryCountsAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := memory.NewBroker()
	w, err := New(broker.Connect(), Config{Logger: quietLog, Policy: Policy{RetryLimit: Limit(0)}})
	if err != nil {
		t.Fatal(err)
	}
	_ = w.Handle("ok", func(context.Context, *Job) error { return nil })
	_ = w.Handle("bad", func(context.Context, *Job) error { return errors.New("no") })
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := w.Enqueue(ctx, &Job{Type: "ok"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Enqueue(ctx, &Job{Type: "bad"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the jobs to end", func() bool {
		s, _ := w.Stats(ctx, DefaultQueue)
		return s.Ready == 0 && s.InFlight == 0 && s.Dead == 1
	})
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	ops, _ := New(broker.Connect(), Config{Logger: quietLog})
	h, err := ops.History(ctx, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var ok, dead int64
	for _, m := range h {
		for _, s := range m.Series {
			if s.Queue == DefaultQueue && s.Type == "ok" {
				ok += s.Succeeded
			}
			if s.Queue == DefaultQueue && s.Type == "bad" {
				dead += s.DeadLettered
			}
		}
	}
	if ok != 3 || dead != 1 {
		t.Fatalf("history counted %d succeeded and %d dead-lettered, want 3 and 1: %+v", ok, dead, h)
	}
}

// Without a store there are no records: the error says so.
func TestWorkersWithoutStore(t *testing.T) {
	t.Parallel()
	p, err := New(noStore{memory.NewBroker().Connect()}, Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Workers(context.Background()); !errors.Is(err, ErrNoStore) {
		t.Fatalf("Workers without a store: %v, want ErrNoStore", err)
	}
	if _, err := p.History(context.Background(), time.Time{}); !errors.Is(err, ErrNoStore) {
		t.Fatalf("History without a store: %v, want ErrNoStore", err)
	}
}

// noStore hides the memory backend's store.
type noStore struct{ driver.Backend }
