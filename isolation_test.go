package asyncplatform

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asyncplatform/asyncplatform/backend/memory"
	"github.com/asyncplatform/asyncplatform/driver"
)

// crash makes the next delivery of the queue's first job end with no
// outcome, as a dying worker's would.
func crash(t *testing.T, b driver.Backend, queue string) {
	t.Helper()
	ds, err := b.Receive(context.Background(), queue, 1, 20*time.Millisecond)
	if err != nil || len(ds) != 1 {
		t.Fatalf("crash: %d deliveries, %v", len(ds), err)
	}
	time.Sleep(60 * time.Millisecond) // its lease lapses
}

// A job is a suspect while its newest history line is a crash: not once
// it has failed since, nor once its isolated run was rejected.
func TestSuspect(t *testing.T) {
	j := &Job{Crashes: 1, Errors: []string{"try 1" + crashNote}}
	if !suspect(j) {
		t.Error("a job back from a crash is no suspect")
	}
	cleared(j)
	if suspect(j) || len(j.Errors) != 1 {
		t.Errorf("after its isolated run was rejected: suspect %v, history %q", suspect(j), j.Errors)
	}
	j = &Job{Crashes: 1, Failures: 1, Errors: []string{"try 1" + crashNote, "try 2 at ...: boom"}}
	if suspect(j) {
		t.Error("a job that failed after its crash is still a suspect")
	}
}

// A broker that reports an absurd delivery count (on RabbitMQ and NATS a
// header any writer sets is part of it) costs no loop per delivery: the
// crashes are bounded and the history keeps its limit.
func TestDeliveryCountBounded(t *testing.T) {
	mem, _ := memory.New(context.Background(), memory.Config{})
	p, err := New(mem, Config{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	msg := p.message(&Job{ID: "x", Type: "t", EnqueuedAt: time.Now()})
	start := time.Now()
	var j Job
	if err := p.decodeDelivery(&driver.Delivery{Queue: "q", Body: msg.Body, Deliveries: 1 << 50}, &j, nil); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second || j.Crashes != maxCrashes || len(j.Errors) != DefaultErrorHistory || !suspect(&j) {
		t.Errorf("took %v; crashes %d, %d history lines", took, j.Crashes, len(j.Errors))
	}
}

// A panic while a suspect is isolated (a log handler's, here) does not leave
// the platform closed: the jobs after it run.
func TestIsolationPanicSafe(t *testing.T) {
	ctx := context.Background()
	broker := memory.NewBroker()
	producer, _ := New(broker.Connect(), Config{Logger: quietLog})
	_ = producer.Enqueue(ctx, &Job{ID: "suspect", Type: "t"})
	crash(t, broker.Connect(), DefaultQueue)
	for i := range 5 {
		_ = producer.Enqueue(ctx, &Job{ID: fmt.Sprint("n", i), Type: "t"})
	}
	var panicked atomic.Bool
	var ran atomic.Int32
	p, err := New(broker.Connect(), Config{Logger: slog.New(panicOn{"running a suspect alone", &panicked})})
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Handle("t", func(ctx context.Context, j *Job) error {
		if j.ID != "suspect" {
			ran.Add(1)
		}
		return nil
	})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	waitUntil(t, "the suspect's isolation (the test's premise)", panicked.Load)
	n := ran.Load()
	for i := range 3 {
		_ = producer.Enqueue(ctx, &Job{ID: fmt.Sprint("after", i), Type: "t"})
	}
	waitUntil(t, "the jobs enqueued after the panic to run", func() bool { return ran.Load() == n+3 })
}

// A suspect that its gate dead-letters (poisoned, here) does not wait for
// the handlers beside it: isolation is only for a suspect that will run.
func TestIsolationAfterTheGate(t *testing.T) {
	ctx := context.Background()
	broker := memory.NewBroker()
	producer, _ := New(broker.Connect(), Config{Logger: quietLog})
	_ = producer.Enqueue(ctx, &Job{ID: "poisoned", Type: "t", Policy: Policy{PoisonLimit: Limit(0)}})
	crash(t, broker.Connect(), DefaultQueue)
	_ = producer.Enqueue(ctx, &Job{ID: "slow", Type: "slow"})
	release := make(chan struct{})
	defer close(release)
	dead := make(chan DeadLetter, 1)
	p, err := New(broker.Connect(), Config{Logger: quietLog, Hooks: Hooks{OnDeadLetter: func(_ context.Context, dl DeadLetter) { dead <- dl }}})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, 1)
	_ = p.Handle("slow", func(ctx context.Context, j *Job) error {
		started <- struct{}{}
		<-release
		return nil
	})
	_ = p.Handle("t", func(context.Context, *Job) error { return nil })
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_ = p.Stop(sctx)
	}()
	select {
	case dl := <-dead:
		if dl.Reason != ReasonPoisoned {
			t.Errorf("dead-lettered %s, want poisoned", dl.Reason)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the poisoned suspect waited for the slow handler beside it")
	}
}

// panicOn is a slog handler that panics on a message containing text.
type panicOn struct {
	text string
	hit  *atomic.Bool
}

func (h panicOn) Enabled(context.Context, slog.Level) bool { return true }
func (h panicOn) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.text) && h.hit.CompareAndSwap(false, true) {
		panic(errors.New("a log handler panicked"))
	}
	return nil
}
func (h panicOn) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h panicOn) WithGroup(string) slog.Handler      { return h }
