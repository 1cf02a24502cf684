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
	var after atomic.Int32 // runs of the jobs enqueued after the panic
	p, err := New(broker.Connect(), Config{Logger: slog.New(panicOn{"running a suspect alone", &panicked})})
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Handle("t", func(ctx context.Context, j *Job) error {
		if strings.HasPrefix(j.ID, "after") {
			after.Add(1)
		}
		return nil
	})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Stop(ctx)
	waitUntil(t, "the suspect's isolation (the test's premise)", panicked.Load)
	for i := range 3 {
		_ = producer.Enqueue(ctx, &Job{ID: fmt.Sprint("after", i), Type: "t"})
	}
	// Counted by ID: the jobs handed back while the suspect waited to run
	// alone may run before or after these.
	waitUntil(t, "the jobs enqueued after the panic to run", func() bool { return after.Load() >= 3 })
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

// A suspect runs alone until it reports an outcome: after a crash its next
// attempt is isolated; once that attempt has failed (or been rejected), the
// attempt after it is not.
func TestSuspectUntilOutcome(t *testing.T) {
	for _, how := range []string{"fails", "rejected"} {
		t.Run(how, func(t *testing.T) {
			ctx := context.Background()
			broker := memory.NewBroker()
			producer, _ := New(broker.Connect(), Config{Logger: quietLog})
			_ = producer.Enqueue(ctx, &Job{ID: "s", Type: "t", Policy: Policy{BackoffBase: time.Millisecond, BackoffCap: time.Millisecond}})
			crash(t, broker.Connect(), DefaultQueue)
			attempts := make(chan Attempt, 3)
			p, err := New(broker.Connect(), Config{Logger: quietLog, Hooks: Hooks{AfterAttempt: func(_ context.Context, a Attempt) { attempts <- a }}})
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int32
			_ = p.Handle("t", func(ctx context.Context, j *Job) error {
				if runs.Add(1) > 1 {
					return nil
				}
				if how == "rejected" {
					return RejectAfter(errors.New("not now"), time.Millisecond)
				}
				return errors.New("boom")
			})
			if err := p.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer p.Stop(ctx)
			for i, want := range []bool{true, false} {
				select {
				case a := <-attempts:
					if a.Isolated != want {
						t.Errorf("attempt %d (try %d, %s): isolated %v, want %v", i+1, a.Job.TryCount, a.Outcome, a.Isolated, want)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("attempt %d never came", i+1)
				}
			}
		})
	}
}

// A job starts afresh, no suspect, when it is moved back from a paused
// group's held queue (its deliveries there are no crashes), enqueued again
// from its own delivery, or redriven from a dead letter.
func TestSuspectNotCarriedAfresh(t *testing.T) {
	ctx := context.Background()
	type seen struct {
		id       string
		isolated bool
		crashes  int
	}
	run := func(t *testing.T, broker *memory.Broker, n int) []seen {
		t.Helper()
		attempts := make(chan Attempt, n)
		p, err := New(broker.Connect(), Config{Logger: quietLog, Hooks: Hooks{AfterAttempt: func(_ context.Context, a Attempt) { attempts <- a }}})
		if err != nil {
			t.Fatal(err)
		}
		_ = p.Handle("t", func(context.Context, *Job) error { return nil })
		_ = p.Handle("again", func(ctx context.Context, j *Job) error {
			next := *j
			next.ID, next.Type = j.ID+"-again", "t"
			return p.Enqueue(ctx, &next)
		})
		if err := p.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer p.Stop(ctx)
		var got []seen
		for range n {
			select {
			case a := <-attempts:
				got = append(got, seen{a.Job.ID, a.Isolated, a.Job.Crashes})
			case <-time.After(10 * time.Second):
				t.Fatalf("%d of %d attempts came: %+v", len(got), n, got)
			}
		}
		return got
	}
	t.Run("held", func(t *testing.T) {
		broker := memory.NewBroker()
		admin, _ := New(broker.Connect(), Config{Logger: quietLog})
		_ = admin.PauseGroup(ctx, DefaultQueue, "g")
		w, _ := New(broker.Connect(), Config{Logger: quietLog})
		if err := w.Start(ctx); err != nil {
			t.Fatal(err)
		}
		_ = admin.Enqueue(ctx, &Job{ID: "h", Type: "t", Group: "g"})
		waitUntil(t, "the job to be set aside", func() bool {
			st, _ := admin.Stats(ctx, HeldQueue(DefaultQueue, "g"))
			return st.Ready == 1
		})
		_ = w.Stop(ctx)
		crash(t, broker.Connect(), HeldQueue(DefaultQueue, "g")) // a ResumeGroup that died holding it
		if n, err := admin.ResumeGroup(ctx, DefaultQueue, "g"); n != 1 || err != nil {
			t.Fatalf("ResumeGroup = %d, %v", n, err)
		}
		if got := run(t, broker, 1); got[0] != (seen{"h", false, 0}) {
			t.Errorf("the job moved back: %+v, want no crash and no isolation", got[0])
		}
	})
	t.Run("enqueued again", func(t *testing.T) {
		broker := memory.NewBroker()
		admin, _ := New(broker.Connect(), Config{Logger: quietLog})
		_ = admin.Enqueue(ctx, &Job{ID: "e", Type: "again"})
		crash(t, broker.Connect(), DefaultQueue)
		got := run(t, broker, 2)
		want := []seen{{"e", true, 1}, {"e-again", false, 0}}
		if got[0] != want[0] || got[1] != want[1] {
			t.Errorf("attempts %+v, want %+v", got, want)
		}
	})
	t.Run("redriven", func(t *testing.T) {
		broker := memory.NewBroker()
		admin, _ := New(broker.Connect(), Config{Logger: quietLog})
		_ = admin.Enqueue(ctx, &Job{ID: "r", Type: "t", Policy: Policy{PoisonLimit: Limit(0)}})
		crash(t, broker.Connect(), DefaultQueue)
		w, _ := New(broker.Connect(), Config{Logger: quietLog})
		_ = w.Handle("t", func(context.Context, *Job) error { return nil })
		if err := w.Start(ctx); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the poisoned job's dead letter", func() bool {
			st, _ := admin.Stats(ctx, DefaultQueue)
			return st.Dead == 1
		})
		_ = w.Stop(ctx)
		if n, err := admin.Redrive(ctx, DefaultQueue); n != 1 || err != nil {
			t.Fatalf("Redrive = %d, %v", n, err)
		}
		if got := run(t, broker, 1); got[0] != (seen{"r", false, 0}) {
			t.Errorf("the redriven job: %+v, want no crash and no isolation", got[0])
		}
	})
}
