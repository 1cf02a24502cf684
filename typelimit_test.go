package asyncplatform

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// A job its type's limit refuses ends its delivery by the same settle path
// as any other: a tracked job's status says when it comes again, and no try
// is spent.
func TestOverLimitSettledLikeAnyEnd(t *testing.T) {
	ctx := t.Context()
	broker := memory.NewBroker()
	cfg := Config{Logger: quietLog, TrackStatus: true, LimitDelay: time.Minute,
		Limits: map[string]TypeLimit{"t": {Concurrency: 1}}}
	producer, err := New(broker.Connect(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"first", "second"} {
		if err := producer.Enqueue(ctx, &Job{ID: id, Type: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	release := make(chan struct{})
	started := make(chan string, 2)
	p, err := New(broker.Connect(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Handle("t", func(ctx context.Context, j *Job) error {
		started <- j.ID
		<-release
		return nil
	})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { close(release); _ = p.Stop(ctx) }()
	running := <-started
	other := map[string]string{"first": "second", "second": "first"}[running]
	var st JobStatus
	waitUntil(t, "the refused job's status to say when it comes again", func() bool {
		st, err = p.Status(ctx, other)
		return err == nil && st.State == StateScheduled
	})
	if wait := time.Until(st.RetryAt); wait < 20*time.Second || wait > 90*time.Second {
		t.Errorf("the refused job comes again in %v, want about LimitDelay (1m ±50%%)", wait)
	}
	if st.Failures != 0 || st.Crashes != 0 {
		t.Errorf("the refused job was charged: %d failures, %d crashes", st.Failures, st.Crashes)
	}
}

// slowAcks is a backend whose acknowledgements take a while, as a remote
// broker's do; it counts requeues.
type slowAcks struct {
	driver.Backend
	requeues atomic.Int32
}

func (b *slowAcks) Capabilities() driver.Capabilities {
	c := b.Backend.Capabilities()
	c.LocalSettle = false // a round trip to overlap
	return c
}

func (b *slowAcks) Ack(ctx context.Context, d *driver.Delivery) error {
	time.Sleep(20 * time.Millisecond)
	return b.Backend.Ack(ctx, d)
}

func (b *slowAcks) Requeue(ctx context.Context, d *driver.Delivery, m driver.Message) error {
	b.requeues.Add(1)
	return b.Backend.Requeue(ctx, d, m)
}

// A job's type limit place is given back when its handler returns, before
// its settle: while one job's acknowledgement is on its way, the next job
// of the type runs under a limit equal to the queue's Concurrency, and
// none is refused.
func TestLimitFreedBeforeSettle(t *testing.T) {
	ctx := t.Context()
	broker := memory.NewBroker()
	b := &slowAcks{Backend: broker.Connect()}
	cfg := Config{Logger: quietLog, LimitDelay: time.Minute,
		Queues: map[string]QueueConfig{DefaultQueue: {Concurrency: 1, Prefetch: Limit(1)}},
		Limits: map[string]TypeLimit{"t": {Concurrency: 1}}}
	p, err := New(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	for range n {
		if err := p.Enqueue(ctx, &Job{Type: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	var ran atomic.Int32
	_ = p.Handle("t", func(context.Context, *Job) error { ran.Add(1); return nil })
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop(ctx) }()
	waitUntil(t, "every job to run", func() bool { return ran.Load() == n })
	if r := b.requeues.Load(); r != 0 {
		t.Errorf("%d jobs were refused by a limit no running job reached (requeued)", r)
	}
}
